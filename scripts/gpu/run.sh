#!/usr/bin/env bash
# Runs the GPU checks in one go on the GPU machine and leaves everything under $OUT.
#
#   scripts/gpu/run.sh smoke        every workload, small shapes, under the shim
#   scripts/gpu/run.sh reference    determinism, shim on both routes, cost of observing, baselines
#   scripts/gpu/run.sh conv_llama   the same for the convnet and the Llama-from-config model
#   scripts/gpu/run.sh all_eager    reference (determinism, shim, cost) + conv_llama, in one call
#   scripts/gpu/run.sh compiled     the Llama model under torch.compile
#   scripts/gpu/run.sh cost         cost of observing: reference and convnet, CUPTI on and off
#   scripts/gpu/run.sh traces       record the step traces kept in bench/traces/
#   scripts/gpu/run.sh final        visibility, event timing (CUPTI off / taken over), offloadd
# Several plans may be given; each leaves $OUT/results-<plan>.tgz.
#
# Uses prebuilt binaries from $OFFLOAD_BIN (default .carry/bin: liboffload.so, offloadctl),
# built on the development machine (the GPU machine has no spdlog); builds there otherwise.
set -uo pipefail
if [ $# -gt 1 ]; then
  for p in "$@"; do "$0" "$p"; done
  exit 0
fi
plan=${1:-smoke}
root=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$root/out}
work=$OUT/work
mkdir -p "$work"
bin=${OFFLOAD_BIN:-$root/.carry/bin}
lib=$bin/liboffload.so
ctl=$bin/offloadctl
log() { echo "[gpu] $*"; }
[ -x "$ctl" ] && [ -f "$lib" ] || { echo "no prebuilt liboffload.so/offloadctl in $bin" >&2; exit 1; }

git -C "$root" rev-parse HEAD > "$work/commit" 2>/dev/null || echo unknown > "$work/commit"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; } > "$work/machine.txt" 2>&1
cat "$work/machine.txt"

export PYTHONUNBUFFERED=1
bench=$root/scripts/bench/run.py

# run NAME SHIM(0|1|2 = off | route 1 | route 2) ARGS...
run() {
  local name=$1 shim=$2; shift 2
  local envs=(env)
  case $shim in
    0) envs+=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) ;;
    1) envs+=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync LD_PRELOAD=$lib OFFLOAD_TRACE=$work/trace_$name) ;;
    1n) envs+=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync LD_PRELOAD=$lib OFFLOAD_TELEMETRY=off) ;;
    2) envs+=(-u PYTORCH_CUDA_ALLOC_CONF LD_PRELOAD=$lib OFFLOAD_LIB=$lib OFFLOAD_TRACE=$work/trace_$name) ;;
  esac
  local extra=()
  [ "$shim" = 2 ] && extra+=(--route 2)
  log "run $name (shim=$shim): $*"
  local t0=$SECONDS
  "${envs[@]}" python3 "$bench" "$@" "${extra[@]}" --json-out "$work/$name.json" > "$work/$name.log" 2>&1
  local rc=$?
  log "  rc=$rc in $((SECONDS - t0)) s: $(grep -E '^RESULT' "$work/$name.log" | head -c 300)"
  [ $rc = 0 ] || tail -n 25 "$work/$name.log"
  if [ -d "$work/trace_$name" ]; then
    "$ctl" trace check "$work/trace_$name" > "$work/$name.check" 2>&1
    log "  trace check rc=$?"; tail -n 14 "$work/$name.check"
  fi
}

case $plan in
  smoke)
    run ref_small_r1 1 --workload reference --small --steps 8 --warmup 2
    run ref_small_r2 2 --workload reference --small --steps 8 --warmup 2
    run conv_small_r1 1 --workload convnet --small --steps 8 --warmup 2
    run llama_small_r1 1 --workload llama --small --steps 8 --warmup 2
    run llama_small_compile_r1 1 --workload llama --small --compile --steps 8 --warmup 3
    ;;
  reference)
    # Determinism against itself, then with the shim (both routes).
    run reference_det_a 0 --workload reference --steps 10 --warmup 3 --deterministic
    run reference_det_b 0 --workload reference --steps 10 --warmup 3 --deterministic
    run reference_det_r1 1 --workload reference --steps 10 --warmup 3 --deterministic
    run reference_det_r2 2 --workload reference --steps 10 --warmup 3 --deterministic
    # Cost of observing: interleaved, default (fast) algorithms.
    for i in 1 2; do
      run reftime_plain_$i 0 --workload reference --steps 30 --warmup 5
      run reftime_shim_$i 1 --workload reference --steps 30 --warmup 5
    done
    run reference_ckpt 0 --workload reference --mode ckpt --steps 10 --warmup 3
    run reference_save_on_cpu 0 --workload reference --mode save_on_cpu --steps 5 --warmup 2
    ;;
  conv_llama)
    for w in convnet llama; do
      run ${w}_det_a 0 --workload $w --steps 10 --warmup 3 --deterministic
      run ${w}_det_b 0 --workload $w --steps 10 --warmup 3 --deterministic
      run ${w}_det_r1 1 --workload $w --steps 10 --warmup 3 --deterministic
      run ${w}_det_r2 2 --workload $w --steps 10 --warmup 3 --deterministic
      run ${w}_ckpt 0 --workload $w --mode ckpt --steps 10 --warmup 3
      run ${w}_save_on_cpu 0 --workload $w --mode save_on_cpu --steps 5 --warmup 2
    done
    ;;
  all_eager)
    # One call's worth: every eager workload's determinism and visibility, the cost of
    # observing, and the convnet/llama baselines.
    run reference_det_a 0 --workload reference --steps 10 --warmup 3 --deterministic
    run reference_det_r1 1 --workload reference --steps 10 --warmup 3 --deterministic
    run reference_det_r2 2 --workload reference --steps 10 --warmup 3 --deterministic
    run reftime_plain_1 0 --workload reference --steps 30 --warmup 5
    run reftime_shim_1 1 --workload reference --steps 30 --warmup 5
    for w in convnet llama; do
      run ${w}_det_a 0 --workload $w --steps 10 --warmup 3 --deterministic
      run ${w}_det_b 0 --workload $w --steps 10 --warmup 3 --deterministic
      run ${w}_det_r1 1 --workload $w --steps 10 --warmup 3 --deterministic
      run ${w}_det_r2 2 --workload $w --steps 10 --warmup 3 --deterministic
      run ${w}_ckpt 0 --workload $w --mode ckpt --steps 5 --warmup 2
      run ${w}_save_on_cpu 0 --workload $w --mode save_on_cpu --steps 5 --warmup 2
    done
    ;;
  compiled)
    run llamac_det_a 0 --workload llama --compile --steps 8 --warmup 4 --deterministic
    run llamac_det_b 0 --workload llama --compile --steps 8 --warmup 4 --deterministic
    run llamac_det_r1 1 --workload llama --compile --steps 8 --warmup 4 --deterministic
    run llamac_det_r2 2 --workload llama --compile --steps 8 --warmup 4 --deterministic
    ;;
  traces)
    # Record the step traces that bench/traces/ keeps (with GPU times).
    run reference_det_r1 1 --workload reference --steps 10 --warmup 3 --deterministic
    run convnet_det_r1 1 --workload convnet --steps 10 --warmup 3 --deterministic
    run llamac_det_r1 1 --workload llama --compile --steps 8 --warmup 4 --deterministic
    ;;
  final)
    # The shim as committed: CUPTI visibility, event timing with CUPTI off, event timing
    # after torch.profiler takes CUPTI over, and the offloadd the shim starts itself.
    run reference_det_r1 1 --workload reference --steps 10 --warmup 3 --deterministic
    run reference_nocupti 1n --workload reference --steps 10 --warmup 3
    run reference_profiled 1 --workload reference --steps 20 --warmup 3 --profile
    "$bin/offloadctl" status > "$work/offloadctl-status.txt" 2>&1; cat "$work/offloadctl-status.txt"
    "$bin/offloadctl" stop
    ;;
  cost)
    # Where the launch-bound convnet's overhead goes: the shim with and without CUPTI.
    run convtime_plain 0 --workload convnet --steps 20 --warmup 3
    run convtime_shim 1 --workload convnet --steps 20 --warmup 3
    run convtime_shim_nocupti 1n --workload convnet --steps 20 --warmup 3
    run reftime_plain_2 0 --workload reference --steps 30 --warmup 5
    run reftime_shim_2 1 --workload reference --steps 30 --warmup 5
    ;;
  *) echo "unknown plan '$plan' (smoke, reference, conv_llama, all_eager, compiled, cost, traces, final)" >&2; exit 2 ;;
esac

for base in "$work"/*_det_a.json; do
  [ -f "$base" ] || continue
  prefix=$(basename "$base" _det_a.json)
  python3 "$root/scripts/bench/compare.py" --baseline "$base" "$work/${prefix}"_*.json >> "$work/compare.md" 2>&1
done
[ -f "$work/compare.md" ] && cat "$work/compare.md"
tar czf "$OUT/results-$plan.tgz" -C "$work" . && rm -rf "$work"
log "done: $OUT/results-$plan.tgz"
