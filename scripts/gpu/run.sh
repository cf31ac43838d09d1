#!/usr/bin/env bash
# Runs the GPU checks in one go on the GPU machine and leaves everything under $OUT.
#
#   scripts/gpu/run.sh smoke        every workload, small shapes, under the shim
#   scripts/gpu/run.sh reference    determinism, shim on both routes, cost of observing, baselines
#   scripts/gpu/run.sh conv_llama   the same for the convnet and the Llama-from-config model
#   scripts/gpu/run.sh all_eager    reference (determinism, shim, cost) + conv_llama, in one run
#   scripts/gpu/run.sh compiled     the Llama model under torch.compile
#   scripts/gpu/run.sh cost         cost of observing: reference and convnet, CUPTI on and off
#   scripts/gpu/run.sh traces       record the step traces kept in tests/data/traces/
#   scripts/gpu/run.sh final        visibility, event timing (CUPTI off / taken over), offloadd
#   scripts/gpu/run.sh executor_smoke  offload executor: reference --small and full, plain vs a
#                                   budget of 50% of plain's footprint, bitwise pass/fail (~3 min)
#   scripts/gpu/run.sh executor     every workload, deterministic, plain vs offload (reference
#                                   at 50%, the others at 60% of plain's footprint), reference
#                                   ckpt and save_on_cpu; executor_report.py -> executor.md (< 9 min;
#                                   skips llama --compile when short of time)
#   scripts/gpu/run.sh executor_compiled  only executor's llama --compile pair, and its report
#   scripts/gpu/run.sh pool_trim    the pool after the plan as a training script leaves it (run.py
#                                   --keep-pool: no empty_cache): reference and convnet (or
#                                   $POOL_TRIM_WORKLOADS: reference convnet llama), plain,
#                                   offload with $OFFLOAD_BIN_PREV's binaries (no trim of their
#                                   own) and with these; bitwise checks, the device's used memory
#                                   over the timed steps (< 5 min)
#   scripts/gpu/run.sh cache_workloads  OFFLOAD_BLOCK_CACHE on the reference, convnet and Llama
#                                   workloads ($CACHE_WORKLOADS: some of them): plain, offload,
#                                   offload with the cache, bitwise checks, footprints, the
#                                   cache's counters (< 8 min)
#   scripts/gpu/run.sh planner      the GPU-time planner on the reference workload: plain, ckpt,
#                                   save_on_cpu, offload at 90/75/50% and at the hidden-offload
#                                   budget; the link measured; planner_report.py -> planner.md
#   scripts/gpu/run.sh planner_diag  the reference at 75% and 50%, traced with transfers: link_use.py
#                                   splits each step into head, copies out, turn, reloads, tail
#   scripts/gpu/run.sh refine       PoolRefine on the reference (90/75/50%, 75% without it; with
#                                   REFINE_BASELINES=1 also ckpt, save_on_cpu and the hidden budget,
#                                   the planner table) and, with --keep-pool, the reference at 50% and
#                                   llama at 75% (\$REFINE_KEEP_WORKLOADS), and without marks
#                                   \$REFINE_UNMARKED_WORKLOADS (the trim at the first launch) (< 8 min)
#   scripts/gpu/run.sh sanitize_small  memcheck on a small offloaded run (diagnosis, < 3 min)
#   scripts/gpu/run.sh sanitize     compute-sanitizer memcheck, then synccheck, on an offloaded
#                                   reference run (budget 50% of plain's footprint; < 10 min)
#   scripts/gpu/run.sh multigpu_smoke  several GPUs, small shapes: DDP and FSDP2 (checkpointed)
#                                   reference, plain vs offload, one offloadd (< 4 min)
#   scripts/gpu/run.sh multigpu_fsdp  only multigpu's FSDP2 pair ($MULTIGPU_NODE_LINK: --node-link)
#   scripts/gpu/run.sh persistent   OFFLOAD_PERSISTENT_MIN on the GPU: the reference workload
#                                   (small, then full shapes) with large allocations served
#                                   by the shim's own ranges, no budget, against plain:
#                                   bitwise, ms/step and the pool's counters (< 3 min)
#   scripts/gpu/run.sh multigpu     several GPUs (all visible, or $MULTIGPU_N): the link with
#                                   all GPUs copying at once; DDP reference at 75% and FSDP2
#                                   reference (checkpointed) at 90%, plain vs offload under one
#                                   offloadd with the measured --node-link; DDP again planned
#                                   without it; then a pool smaller than the ranks ask for (fair
#                                   shares); multigpu_report.py -> multigpu.md (< 9 min)
#   scripts/gpu/run.sh weights      weight streaming (lora: bf16 weights about twice a 20 GiB
#                                   budget): resident ckpt (the reference), the hand-written
#                                   streaming baseline (--mode stream, no shim, PyTorch's native
#                                   allocator), ckpt under the shim (OFFLOAD_PERSISTENT_MIN=64MiB)
#                                   at 20 GiB and at 24 GiB; small shapes first; bitwise
#                                   checks (< 10 min)
#   scripts/gpu/run.sh weights_moe  weight streaming on the moe workload (frozen experts of 38.7 GiB,
#                                   20 GiB): small shapes, resident, then the baseline and the shim
#                                   alternated ($MOE_ARMS); bitwise checks, ab_report.py (< 10 min)
#   scripts/gpu/run.sh weights_20   the baseline and the shim at 20 GiB, back to back, then the
#                                   shim with the frozen base marked read-only (< 7 min)
#   scripts/gpu/run.sh weights_20_telemetry  resident, the baseline, and the marked shim at 20 GiB
#                                   with and without CUPTI (< 6 min)
#   scripts/gpu/run.sh weights_20_sampled  the same with OFFLOAD_TELEMETRY=sampled in place of
#                                   CUPTI off (< 7 min)
#   scripts/gpu/run.sh weights_ab   the baseline and the marked shim (OFFLOAD_TELEMETRY=sampled)
#                                   at 20 GiB, two runs each, alternated; ab_report.py (< 8 min);
#                                   WEIGHTS_AB_ARMS="floor_1 shim_1 shim_2 floor_2" against the
#                                   shim's own floor instead (resident, observed, CUPTI off)
#   scripts/gpu/run.sh weights_diag  the baseline observed by the shim and the marked shim at 20 GiB,
#                                   both traced with GPU times; gaps.py per step (< 5 min)
#   scripts/gpu/run.sh sync_cost    scripts/bench/sync_cost.py: the GPU time of a cross-stream wait,
#                                   a copy and the driver's map/unmap while kernels run (< 1 min)
#   scripts/gpu/run.sh sync_events   the executor's event records and cross-stream waits, alone
#                                   and chained as per window (< 2 min)
#   scripts/gpu/run.sh vmm_use       a fresh mapping's first use, and the unmap of a range just
#                                   read, on the GPU (< 2 min)
#   scripts/gpu/run.sh pool_ops      stream-ordered allocations and frees around every launch, as
#                                   PyTorch's cudaMallocAsync backend makes them (< 1 min)
#   scripts/gpu/run.sh power_link    lora's GEMMs alone and beside host-to-device copies (30% and
#                                   100% of the time): whether link traffic slows compute at the
#                                   power cap, per ms of link busy (< 3 min)
#   scripts/gpu/run.sh sync_cost_shim  the same under the shim, CUPTI on and off (< 2 min)
#   scripts/gpu/run.sh sampled_smoke  the marked shim alone with OFFLOAD_TELEMETRY=sampled: the
#                                   pause and resume on real CUPTI, bitwise (< 2 min)
# Several plans may be given; each leaves $OUT/results-<plan>.tgz.
#
# Offload runs (run kind o) take OFFLOAD_DEVICE_BUDGET from $budget, which budget_of sets from
# a plain run's footprint_peak_bytes. An offload plan restarts offloadd first, so that the
# daemon's pool is OFFLOAD_HOST_POOL=48GiB and not what an earlier run started it with.
#
# Uses prebuilt binaries from $OFFLOAD_BIN (default .carry/bin: liboffload.so, offloadctl,
# offloadd), built on the development machine by scripts/gpu/prepare.sh (the GPU machine has no
# spdlog), which also records their commit.
# shellcheck source-path=SCRIPTDIR
set -uo pipefail
if [ $# -gt 1 ]; then
  for p in "$@"; do "$0" "$p"; done
  exit 0
fi
plan=${1:-smoke}
root=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-$root/out}
# The runs' files gather outside $OUT (the device machine returns at most 8 files from it) and
# $OUT/results-<plan>.tgz is rewritten after every run, so that a run stopped at its limit
# still returns what its finished runs wrote.
work=${RUN_WORK:-$(mktemp -d "${TMPDIR:-/tmp}/offload-run-$plan.XXXXXX")}
mkdir -p "$OUT" "$work"
pack() { tar czf "$OUT/results-$plan.tgz" -C "$work" . 2>/dev/null; }
bin=${OFFLOAD_BIN:-$root/.carry/bin}
lib=$bin/liboffload.so
ctl=$bin/offloadctl
log() { echo "[gpu] $*"; }
[ -x "$ctl" ] && [ -f "$lib" ] || { echo "no prebuilt liboffload.so/offloadctl in $bin" >&2; exit 1; }

# The commit the binaries were built from (scripts/gpu/prepare.sh writes it); the copy of the
# tree on the GPU machine may carry an older .git.
if [ -f "$bin/../commit" ]; then cp "$bin/../commit" "$work/commit"
else git -C "$root" rev-parse HEAD > "$work/commit" 2>/dev/null || echo unknown > "$work/commit"; fi
log "binaries from commit $(cat "$work/commit")"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'; } > "$work/machine.txt" 2>&1
cat "$work/machine.txt"

export PYTHONUNBUFFERED=1
# The columns scripts/bench/gpu_state.py reads, if this nvidia-smi knows them all.
smi_query=$(python3 "$root/scripts/bench/gpu_state.py" --query)
nvidia-smi -i 0 --query-gpu="$smi_query" --format=csv,noheader > /dev/null 2>&1 || { smi_query=; log "no GPU state samples: nvidia-smi lacks a column of the query"; }
bench=$root/scripts/bench/run.py

# Offload runs: route 1 with a device budget ($budget), a host pool large enough for half the
# reference workload's peak, no trace, and log level info so that the shim's plan is logged.
host_pool=48GiB
budget=

# run NAME SHIM(0|0e|1|1n|2|o = off | off, native allocator with expandable segments | route 1 |
#   route 1, CUPTI off | route 2 | offload) ARGS...
# $launch (default python3) starts the bench: `launch="torchrun ..." run ...` for several GPUs
# (the shim, preloaded into torchrun, is built only in the ranks, which use CUDA).
run() {
  local name=$1 shim=$2; shift 2
  local envs=(env)
  if [ "$shim" = o ] && [ -z "$budget" ]; then
    log "run $name: offload run without a \$budget; skipped"
    return 1
  fi
  case $shim in
    0) envs+=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync) ;;
    0e) envs+=(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) ;;  # PyTorch's native allocator
    1) envs+=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync LD_PRELOAD=$lib OFFLOAD_TRACE=$work/trace_$name) ;;
    1n) envs+=(PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync LD_PRELOAD=$lib OFFLOAD_TELEMETRY=off) ;;
    2) envs+=(-u PYTORCH_CUDA_ALLOC_CONF LD_PRELOAD=$lib OFFLOAD_LIB=$lib OFFLOAD_TRACE=$work/trace_$name) ;;
    o) envs+=(-u OFFLOAD_TRACE PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync LD_PRELOAD=$lib
              OFFLOAD_HOST_POOL=$host_pool OFFLOAD_DEVICE_BUDGET=$budget OFFLOAD_LOG_LEVEL=info)
       # $trace_offload=1: the offload run records its steps too (for offloadctl plan later).
       [ "${trace_offload:-0}" = 1 ] && envs+=(OFFLOAD_TRACE=$work/trace_$name) ;;
  esac
  local extra=()
  [ "$shim" = 2 ] && extra+=(--route 2)
  local note=
  [ "$shim" = o ] && note=", budget $budget"
  log "run $name (shim=$shim$note): $*"
  local t0=$SECONDS
  # The GPU's clock, power, temperature and clock event reasons every 500 ms beside the run
  # (GPU 0; reading them changes nothing): runs of one arm differ by more than steps within a run.
  local smi=
  if [ -n "$smi_query" ]; then
    nvidia-smi -i 0 --query-gpu="$smi_query" --format=csv,noheader -lms 500 > "$work/$name.smi" 2>/dev/null &
    smi=$!
  fi
  # shellcheck disable=SC2086
  "${envs[@]}" ${launch:-python3} "$bench" "$@" "${extra[@]}" --json-out "$work/$name.json" > "$work/$name.log" 2>&1
  local rc=$?
  [ -n "$smi" ] && { kill "$smi" 2>/dev/null; wait "$smi" 2>/dev/null; }
  log "  rc=$rc in $((SECONDS - t0)) s: $(grep -E '^RESULT' "$work/$name.log" | head -c 300)"
  [ -n "$smi" ] && log "  gpu: $(python3 "$root/scripts/bench/gpu_state.py" "$work/$name.smi" | cut -d: -f2-)"
  [ $rc = 0 ] || tail -n 25 "$work/$name.log"
  if [ "$shim" = o ]; then
    grep -E '^\[offload (warn|error)\]|^\[offload info\] ([^:]*: )?(plan|not offloading|host pool|step deviates)|\[bench\] (executor|WARNING)' \
      "$work/$name.log" | head -n 12 | cut -c1-600
  fi
  if [ -d "$work/trace_$name" ]; then
    "$ctl" trace check "$work/trace_$name" > "$work/$name.check" 2>&1
    log "  trace check rc=$?"; tail -n 14 "$work/$name.check"
  fi
  pack
}

# executor_fraction WORKLOAD: executor's budget for the workload, as a fraction of its plain
# footprint (convnet's 60% and Llama's 75%: the smallest the built-in plan meets, from recorded
# traces).
executor_fraction() {
  case $1 in reference) echo 0.5 ;; llama) echo 0.75 ;; *) echo 0.6 ;; esac
}

# budget_of PLAIN_NAME FRACTION: sets $budget to FRACTION of the plain run's footprint_peak_bytes
# in bytes; below the shim's 256 MiB floor for a byte count (--small), as a fraction of the GPU.
budget_of() {
  budget=$(python3 - "$work/$1.json" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
b = int(r["footprint_peak_bytes"] * float(sys.argv[2]))
print(b if b >= 256 << 20 else f"{b / r['device_total_bytes']:.12f}")
PY
  ) || { budget=; log "no footprint in $work/$1.json: no budget"; return 1; }
  log "budget: $2 of $1's footprint = $budget"
}

# check_pair PLAIN_NAME OFFLOAD_NAME: quick bitwise pass/fail (losses, gradients); also shows
# the footprint against the budget and the timed steps' demand reloads.
check_pair() {
  if [ ! -f "$work/$1.json" ] || [ ! -f "$work/$2.json" ]; then
    log "check $1 vs $2: FAIL (result missing)"; return 1
  fi
  python3 - "$work/$1.json" "$work/$2.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
losses = a["losses_hex"] == b["losses_hex"]
grads = a["grad_sha256"] == b["grad_sha256"]
x = (b.get("shim") or {}).get("executor") or {}
fp, bud = b.get("footprint_peak_bytes"), x.get("budget")
within = "n/a" if not (fp and bud) else ("yes" if fp <= bud else "NO")
misses = sum((x.get("recent_misses") or [])[-b["steps"]:])
# The peaks are reset before the last warm-up step: a plan active for fewer steps than the timed
# ones and that one came in after the reset, and the footprint counts steps before any plan ran.
# (Counted in the plan's steps, not the shim's: before the first mark the shim may cut steps of
# its own, as it did in moe's model building.)
active = x.get("steps_active", 0) if x.get("installed") else None
late = "" if active is None or active >= b["steps"] + 1 else (
    f" (the plan ran {active} steps, fewer than the {b['steps']} timed and the one before them: "
    "it came in after the peaks were reset, and the footprint counts unplanned steps)")
g = lambda v: f"{v / 2**30:.2f}" if isinstance(v, (int, float)) else "n/a"
print(f"[gpu] check {b['workload']}{' --small' if b['small'] else ''}: "
      f"{'PASS' if losses and grads else 'FAIL'} losses={'same' if losses else 'DIFFER'} "
      f"grads={'same' if grads else 'DIFFER'}; footprint {g(a.get('footprint_peak_bytes'))} -> {g(fp)} GiB, "
      f"budget {g(bud)} GiB, within={within}{late}; installed={x.get('installed')} "
      f"steps_active={x.get('steps_active')} timed-step misses={misses}; "
      f"{a['ms_per_step']:.1f} -> {b['ms_per_step']:.1f} ms/step")
sys.exit(0 if losses and grads else 1)
PY
}

# A running offloadd keeps the pool size it was started with: stop it, so that the next offload
# run starts one with $host_pool.
restart_daemon() { "$ctl" stop > /dev/null 2>&1 && sleep 1; return 0; }
# For runs under compute-sanitizer: offloadd started here, outside the sanitizer's process tree
# (its subreaper waits for every descendant, and a daemon the shim starts never exits).
start_daemon() {
  restart_daemon
  local pool=$1; shift
  setsid "$bin/offloadd" --pool-size "$pool" "$@" >> "$work/offloadd.log" 2>&1 < /dev/null &
  local from=$SECONDS
  # A large pool is allocated before offloadd answers (48 GiB: seconds).
  for _ in $(seq 1 600); do
    "$ctl" status > /dev/null 2>&1 && { log "offloadd up in $((SECONDS - from)) s"; return 0; }
    sleep 0.2
  done
  log "offloadd did not come up"; cat "$work/offloadd.log"; return 1
}
# Waits (at most $1 s) until offloadd has faulted its pool in, as a node's daemon started before
# the training has: a client then pins it about 4x faster.
wait_pool_faulted() {
  local from=$SECONDS
  for _ in $(seq 1 $(( $1 * 5 ))); do
    grep -q "pool faulted in" "$work/offloadd.log" 2>/dev/null && {
      log "offloadd: $(grep -o 'pool faulted in.*' "$work/offloadd.log" | tail -n 1) (waited $((SECONDS - from)) s)"; return 0; }
    sleep 0.2
  done
  log "offloadd's pool not faulted in after $1 s"; return 1
}

# The plans: a function plan_NAME each, by theme in scripts/gpu/plans/; a function that serves
# several plans reads $plan.
# shellcheck source=plans/observe.sh
source "$root/scripts/gpu/plans/observe.sh"
# shellcheck source=plans/executor.sh
source "$root/scripts/gpu/plans/executor.sh"
# shellcheck source=plans/weights.sh
source "$root/scripts/gpu/plans/weights.sh"

case $plan in
  smoke) plan_smoke ;;
  reference) plan_reference ;;
  conv_llama) plan_conv_llama ;;
  all_eager) plan_all_eager ;;
  compiled) plan_compiled ;;
  traces) plan_traces ;;
  final) plan_final ;;
  cost) plan_cost ;;
  executor_smoke) plan_executor_smoke ;;
  executor|executor_compiled) plan_executor ;;
  pool_trim) plan_pool_trim ;;
  cache_workloads) plan_cache_workloads ;;
  planner) plan_planner ;;
  planner_diag) plan_planner_diag ;;
  refine) plan_refine ;;
  sanitize_small) plan_sanitize_small ;;
  sanitize) plan_sanitize ;;
  multigpu_smoke | multigpu | multigpu_fsdp) plan_multigpu ;;
  weights_20) plan_weights_20 ;;
  weights_20_sampled | weights_20_telemetry) plan_weights_20_telemetry ;;
  weights_ab) plan_weights_ab ;;
  weights_diag) plan_weights_diag ;;
  sync_cost) plan_sync_cost ;;
  power_link) plan_power_link ;;
  sync_events) plan_sync_events ;;
  vmm_use) plan_vmm_use ;;
  pool_ops) plan_pool_ops ;;
  sync_cost_shim) plan_sync_cost_shim ;;
  sampled_smoke) plan_sampled_smoke ;;
  weights) plan_weights ;;
  weights_moe) plan_weights_moe ;;
  persistent) plan_persistent ;;
  *) echo "unknown plan '$plan' (smoke, reference, conv_llama, all_eager, compiled, cost, traces, final, executor_smoke, executor, executor_compiled, planner, sanitize_small, sanitize, multigpu_smoke, multigpu, multigpu_fsdp, weights)" >&2; exit 2 ;;
esac

for base in "$work"/*_det_a.json; do
  [ -f "$base" ] || continue
  prefix=$(basename "$base" _det_a.json)
  python3 "$root/scripts/bench/compare.py" --baseline "$base" "$work/${prefix}"_*.json >> "$work/compare.md" 2>&1
done
[ -f "$work/compare.md" ] && cat "$work/compare.md"
pack && rm -rf "$work"
log "done: $OUT/results-$plan.tgz"
