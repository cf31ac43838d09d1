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

# weights_small WORKLOAD [ARGS...]: the weight-streaming workload's small shapes resident, streamed
# by the hand-written baseline, and under the shim (ARGS added) at half the resident footprint
# with OFFLOAD_PERSISTENT_MIN=2MiB (the small models' weights are 1-8 MiB); bitwise checks, each
# failure added to $fails. $trace_offload=1: the shim's run records its steps.
weights_small() {
  local w=$1; shift
  local s=(--workload "$w" --small --deterministic --steps 6 --warmup 6 --mark-steps)
  run "${w}_small_ckpt" 0 "${s[@]}" --mode ckpt
  run "${w}_small_stream" 0 "${s[@]}" --mode stream
  check_pair "${w}_small_ckpt" "${w}_small_stream" || fails=$((fails + 1))
  budget_of "${w}_small_ckpt" 0.5 || { fails=$((fails + 1)); return; }
  OFFLOAD_PERSISTENT_MIN=2MiB run "${w}_small_offload" o "${s[@]}" --mode ckpt "$@"
  check_pair "${w}_small_ckpt" "${w}_small_offload" || fails=$((fails + 1))
}

# runs_of PREFIX ARM: the result files of the runs ARM_N among $arms ($work/PREFIXARM_N.json),
# comma-separated, for ab_report.py; "" unless there are two or more.
runs_of() {
  local f=() n
  for n in "${arms[@]}"; do [[ $n == "$2"_* ]] && [ -f "$work/$1$n.json" ] && f+=("$work/$1$n.json"); done
  [ ${#f[@]} -ge 2 ] && (IFS=,; echo "${f[*]}")
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
  for _ in $(seq 1 50); do "$ctl" status > /dev/null 2>&1 && return 0; sleep 0.2; done
  log "offloadd did not come up"; cat "$work/offloadd.log"; return 1
}

# sync_cost_to NAME [VAR=value ...] -- ARGS: sync_cost.py ARGS (with those variables set for it
# alone), its results in $work/NAME.json and its result lines in $work/NAME.log.
sync_cost_to() {
  local name=$1 vars=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  env "${vars[@]}" python3 "$root/scripts/bench/sync_cost.py" "$@" --json "$work/$name.json" 2>&1 |
    grep -E "^\[sync_cost\]|rror" | tee "$work/$name.log"
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
    # One run's worth: every eager workload's determinism and visibility, the cost of
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
    # Record the step traces that tests/data/traces/ keeps (with GPU times).
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
  executor_smoke)
    restart_daemon
    fails=0
    for sz in small full; do
      args=(--workload reference --deterministic --steps 6 --warmup 8 --mark-steps)
      [ $sz = small ] && args+=(--small)
      run xs_${sz}_plain 0 "${args[@]}"
      budget_of xs_${sz}_plain 0.5 || { fails=$((fails + 1)); continue; }
      run xs_${sz}_offload o "${args[@]}"
      check_pair xs_${sz}_plain xs_${sz}_offload || fails=$((fails + 1))
    done
    log "executor_smoke: $([ $fails = 0 ] && echo PASS || echo "FAIL ($fails)")"
    "$ctl" stop > /dev/null 2>&1
    ;;
  executor|executor_compiled)
    # Every workload, deterministic, 16 warm-up + 20 timed steps (all 36 losses compared);
    # save_on_cpu (about 1 s/step on the reference) runs 2 + 5, before offloadd pins its pool.
    # executor_compiled: only the compiled Llama pair (for when executor had to skip it).
    # 16 warm-up steps: the GPU-time planner's first convnet plan can come as late as step 13,
    # and the peaks must be reset after it (docs/results.md).
    # The plan of arenas, as the table in docs/results.md measures it: not the hard cap.
    export OFFLOAD_CAP=${OFFLOAD_CAP:-0}
    restart_daemon
    t_plan=$SECONDS
    d=(--deterministic --steps 20 --warmup 16 --mark-steps)
    if [ "$plan" = executor ]; then
      run reference_plain 0 --workload reference "${d[@]}"
      run reference_ckpt 0 --workload reference --mode ckpt "${d[@]}"
      run reference_save_on_cpu 0 --workload reference --mode save_on_cpu --deterministic --steps 5 --warmup 2
      budget_of reference_plain "$(executor_fraction reference)" && run reference_offload o --workload reference "${d[@]}"
      for w in convnet llama; do
        run ${w}_plain 0 --workload $w "${d[@]}"
        budget_of ${w}_plain "$(executor_fraction $w)" && run ${w}_offload o --workload $w "${d[@]}"
      done
    fi
    # The compiled pair takes about 3.5 minutes (it compiles twice): only if it still fits.
    if [ "$plan" = executor_compiled ] || (( SECONDS - t_plan < ${EXECUTOR_COMPILE_BY_S:-330} )); then
      run llamac_plain 0 --workload llama --compile "${d[@]}"
      budget_of llamac_plain 0.8 && run llamac_offload o --workload llama --compile "${d[@]}"
    else
      log "skipping llama --compile after $((SECONDS - t_plan)) s: it would not finish in time" \
          "(run the executor_compiled plan)"
    fi
    "$ctl" status > "$work/offloadctl-status.txt" 2>&1
    "$ctl" stop > /dev/null 2>&1
    python3 "$root/scripts/bench/executor_report.py" "$work" > "$work/executor.md" 2>&1
    log "executor_report rc=$? (plan took $((SECONDS - t_plan)) s)"
    cat "$work/executor.md"
    ;;
  pool_trim)
    # PyTorch's cudaMallocAsync backend keeps all it reserved: the steps observed before the plan
    # reserve the whole peak. Every other plan trims the pool at the last warm-up step (run.py's
    # empty_cache); a training script does not. Here nothing but the shim trims (--keep-pool),
    # and each pair is plain against the shim, with the binaries of $OFFLOAD_BIN_PREV (default
    # .carry-prev/bin; no trim of the shim's own) and with these. 20 warm-up steps: convnet's
    # first plan comes at step 12-15, and the trim may take a few steps more (PoolTrim).
    restart_daemon
    d=(--deterministic --steps 20 --warmup 20 --mark-steps --keep-pool)
    prev=${OFFLOAD_BIN_PREV:-$root/.carry-prev/bin}
    fails=0
    for w in ${POOL_TRIM_WORKLOADS:-reference convnet}; do
      run ${w}_keep_plain 0 --workload $w "${d[@]}"
      budget_of ${w}_keep_plain "$(executor_fraction $w)" || { fails=$((fails + 1)); continue; }
      if [ -f "$prev/liboffload.so" ]; then
        log "the shim from $(cat "$prev/../commit" 2>/dev/null || echo "$prev")"
        lib_now=$lib lib=$prev/liboffload.so
        run ${w}_keep_offload_prev o --workload $w "${d[@]}"
        lib=$lib_now
        check_pair ${w}_keep_plain ${w}_keep_offload_prev || fails=$((fails + 1))
      fi
      run ${w}_keep_offload o --workload $w "${d[@]}"
      check_pair ${w}_keep_plain ${w}_keep_offload || fails=$((fails + 1))
      for n in ${w}_keep_plain ${w}_keep_offload_prev ${w}_keep_offload; do
        [ -f "$work/$n.json" ] && python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); x=(r.get("shim") or {}).get("executor") or {}; g=lambda v: round(v / 2**30, 2); print("[gpu]", sys.argv[2], "device used over the timed steps, sampled peak", g(r["device_used_peak_bytes"]), "GiB; pool high", g(r["peak_reserved_high_bytes"]), "GiB; footprint", g(r["footprint_peak_bytes"]), "GiB; pool trims", x.get("pool_trims"), "(", g(x.get("pool_trimmed_bytes") or 0), "GiB )")' "$work/$n.json" $n
      done
    done
    grep -h "pool trimmed" "$work"/*_keep_offload.log | head -4
    log "pool_trim: $([ $fails = 0 ] && echo PASS || echo "FAIL ($fails)")"
    "$ctl" stop > /dev/null 2>&1
    ;;
  cache_workloads)
    # OFFLOAD_BLOCK_CACHE beyond lora: the reference, convnet and Llama workloads at executor's
    # budgets, each plain, offloaded, and offloaded with the cache ($WEIGHTS_BLOCK_CACHE, default
    # 512MiB), 16 warm-up + 20 timed steps, deterministic: losses and gradients against plain,
    # the footprint against the budget, the cache's counters, ms/step (< 8 min). 16 warm-up
    # steps, not 8: the GPU-time planner's first plan can come at step 13 on convnet's 50 ms
    # steps, and the peaks must be reset after it. $CACHE_WORKLOADS: some of them.
    restart_daemon
    d=(--deterministic --steps 20 --warmup ${CACHE_WARMUP:-16} --mark-steps)
    fails=0
    for w in ${CACHE_WORKLOADS:-reference convnet llama}; do
      run ${w}_plain 0 --workload $w "${d[@]}"
      budget_of ${w}_plain "$(executor_fraction $w)" || { fails=$((fails + 1)); continue; }
      run ${w}_offload o --workload $w "${d[@]}"
      OFFLOAD_BLOCK_CACHE=${WEIGHTS_BLOCK_CACHE:-512MiB} run ${w}_offload_cache o --workload $w "${d[@]}"
      check_pair ${w}_plain ${w}_offload || fails=$((fails + 1))
      check_pair ${w}_plain ${w}_offload_cache || fails=$((fails + 1))
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("[gpu]", sys.argv[2], "block cache:", json.dumps((r.get("shim") or {}).get("block_cache")))' \
        "$work/${w}_offload_cache.json" ${w}_offload_cache 2>/dev/null
    done
    log "cache_workloads: $([ $fails = 0 ] && echo PASS || echo "FAIL ($fails)")"
    "$ctl" stop > /dev/null 2>&1
    ;;
  planner)
    # The GPU-time planner on the reference workload, side by side in one run: plain, ckpt,
    # save_on_cpu, and offload at 90%, 75% and 50% of plain's footprint and at the largest
    # offload the planner says the compute hides (its predicted footprint as the budget).
    # The link is measured first (pinned copies, each way and both at once).
    # The plan of arenas, as the table in docs/results.md measures it: not the hard cap.
    export OFFLOAD_CAP=${OFFLOAD_CAP:-0}
    restart_daemon
    python3 "$root/scripts/bench/link.py" > "$work/link.json" 2> "$work/link.log"; cat "$work/link.json"
    # 20 warm-up steps: the plan made again for the pool's measured factor (OFFLOAD_POOL_REFINE)
    # goes in about 6 steps after the first plan.
    d=(--deterministic --steps 20 --warmup 20 --mark-steps)
    run reference_plain 0 --workload reference "${d[@]}"
    run reference_ckpt 0 --workload reference --mode ckpt "${d[@]}"
    run reference_save_on_cpu 0 --workload reference --mode save_on_cpu --deterministic --steps 5 --warmup 2
    for pct in 90 75 50; do
      budget_of reference_plain 0.$pct && run reference_offload_$pct o --workload reference "${d[@]}"
      check_pair reference_plain reference_offload_$pct
    done
    budget=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shim"]["executor"]["planner"]["hidden_peak"])' \
             "$work/reference_offload_90.json" 2>/dev/null)
    if [ -n "$budget" ] && [ "$budget" -gt 0 ] 2>/dev/null; then
      log "budget: the planner's largest hidden offload, footprint $budget"
      run reference_offload_hidden o --workload reference "${d[@]}"
      check_pair reference_plain reference_offload_hidden
    else
      log "no hidden-offload figure from reference_offload_90"
    fi
    "$ctl" status > "$work/offloadctl-status.txt" 2>&1
    "$ctl" stop > /dev/null 2>&1
    python3 "$root/scripts/bench/planner_report.py" "$work" > "$work/planner.md" 2>&1
    cat "$work/planner.md"
    ;;
  planner_diag)
    # Where the 75% run's time goes beyond the per-phase bound (< 5 min): the link measured,
    # plain, offload at 75% (untraced, as in `planner`), then offload at 75% and 50% with every
    # step traced (OFFLOAD_TRACE, transfers and CUPTI times); link_use.py splits each traced
    # step into head, copies out, turn, reloads and tail, and the planner's own timeline for
    # the same budget comes from an observed step of the same run (offloadctl plan --arenas).
    restart_daemon
    python3 "$root/scripts/bench/link.py" > "$work/link.json" 2> "$work/link.log"; cat "$work/link.json"
    d=(--workload reference --deterministic --steps 20 --warmup 8 --mark-steps)
    run reference_plain 0 "${d[@]}"
    budget_of reference_plain 0.75 && run reference_offload_75 o "${d[@]}"
    check_pair reference_plain reference_offload_75
    for pct in 75 50; do
      budget_of reference_plain 0.$pct || continue
      OFFLOAD_TRACE_STEPS=40 OFFLOAD_TRACE_LEAD=1 trace_offload=1 run reference_traced_$pct o "${d[@]}"
      check_pair reference_plain reference_traced_$pct
      t=$work/trace_reference_traced_$pct
      python3 "$root/scripts/bench/link_use.py" "$t" --link "$work/link.json" --json "$work/link_use_$pct.json" | tee "$work/link_use_$pct.txt"
      "$ctl" plan --trace "$t/step-000002.trace" --budget "$budget" --arenas > "$work/plan_$pct.txt" 2>&1
      head -n 12 "$work/plan_$pct.txt"
      python3 "$root/scripts/bench/gaps.py" "$t" > "$work/gaps_$pct.txt" 2>&1; head -n 30 "$work/gaps_$pct.txt"
      rm -f "$t"/*.chrome.json
    done
    "$ctl" stop > /dev/null 2>&1
    ;;
  refine)
    # PoolRefine (OFFLOAD_POOL_REFINE): the pool's factor measured under the plan and the plan
    # made again for it, put in at a step's mark. The reference at 90/75/50% of plain's footprint
    # with it, 75% without it, 20 warm-up steps (the plan made again goes in about 6 steps after
    # the first); then, as a training script leaves the pool (--keep-pool), the reference at 50%
    # and llama at 75%. planner_report.py on the first group.
    # The plan of arenas, as the table in docs/results.md measures it: not the hard cap.
    export OFFLOAD_CAP=${OFFLOAD_CAP:-0}
    restart_daemon
    python3 "$root/scripts/bench/link.py" > "$work/link.json" 2> "$work/link.log"; cat "$work/link.json"
    d=(--workload reference --deterministic --steps 20 --warmup ${REFINE_WARMUP:-20} --mark-steps)
    show() {
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); x=r["shim"]["executor"]; p=x["planner"]; print("[gpu]  ", sys.argv[2], "ms/step %.1f" % r["ms_per_step"], "footprint %.2f GiB" % (r["footprint_peak_bytes"] / 2**30), "factor planned", p.get("pool_overhead"), "seen", p.get("pool_factor_seen"), "refined", p.get("pool_refined"), "installs", x.get("installs"), "deviations", x.get("deviations"), "steps_active", x.get("steps_active"), "| plan:", x.get("plan"))' "$work/$1.json" "$1" 2>/dev/null || log "  no result for $1"
      grep -E "allocator holds|put in at the step|not put in|plan revised" "$work/$1.log" | head -n 6
    }
    run reference_plain 0 "${d[@]}"
    if [ "${REFINE_BASELINES:-0}" = 1 ]; then  # the planner table's other rows
      run reference_ckpt 0 --workload reference --mode ckpt "${d[@]}"
      run reference_save_on_cpu 0 --workload reference --mode save_on_cpu --deterministic --steps 5 --warmup 2
    fi
    for pct in ${REFINE_PCTS:-75 90 50}; do
      budget_of reference_plain 0.$pct || continue
      run reference_offload_$pct o "${d[@]}"
      check_pair reference_plain reference_offload_$pct; show reference_offload_$pct
      if [ $pct = 75 ] && [ "${REFINE_NOREFINE:-1}" = 1 ]; then
        OFFLOAD_POOL_REFINE=0 run reference_norefine_75 o "${d[@]}"
        check_pair reference_plain reference_norefine_75; show reference_norefine_75
      fi
    done
    budget=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shim"]["executor"]["planner"]["hidden_peak"])' \
             "$work/reference_offload_90.json" 2>/dev/null)
    if [ "${REFINE_BASELINES:-0}" = 1 ] && [ -n "$budget" ] && [ "$budget" -gt 0 ] 2>/dev/null; then
      log "budget: the planner's largest hidden offload, footprint $budget"
      run reference_offload_hidden o "${d[@]}"
      check_pair reference_plain reference_offload_hidden; show reference_offload_hidden
    fi
    python3 "$root/scripts/bench/planner_report.py" "$work" > "$work/planner.md" 2>&1
    grep -E "^\| |^- (PASS|FAIL)" "$work/planner.md"
    k=(--deterministic --steps 20 --warmup 20 --mark-steps --keep-pool)
    for w in ${REFINE_KEEP_WORKLOADS-reference llama}; do
      run ${w}_keep_plain 0 --workload $w "${k[@]}"
      budget_of ${w}_keep_plain "$(executor_fraction $w)" || continue
      run ${w}_keep_offload o --workload $w "${k[@]}"
      check_pair ${w}_keep_plain ${w}_keep_offload; show ${w}_keep_offload
    done
    # Without marks (REFINE_UNMARKED_WORKLOADS): the pool is trimmed at the plan's first launch
    # (Executor::trim_before_first_step), not at a mark; first_step_trims counts it.
    for w in ${REFINE_UNMARKED_WORKLOADS-}; do
      u=(--deterministic --steps 20 --warmup 20 --keep-pool)
      run ${w}_unmarked_plain 0 --workload $w "${u[@]}"
      budget_of ${w}_unmarked_plain "$(executor_fraction $w)" || continue
      run ${w}_unmarked_offload o --workload $w "${u[@]}"
      check_pair ${w}_unmarked_plain ${w}_unmarked_offload; show ${w}_unmarked_offload
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); x=r["shim"]["executor"]; print("[gpu]   first_step_trims", x.get("first_step_trims"), "pool_trims", x.get("pool_trims"), "footprint %.2f GiB" % (r["footprint_peak_bytes"] / 2**30))' \
        "$work/${w}_unmarked_offload.json" 2>/dev/null || log "  no result"
    done
    "$ctl" stop > /dev/null 2>&1
    ;;
  sanitize_small)
    # Where the sanitizer runs stall: a small offloaded run under memcheck, the shim preloaded
    # into python only (not into compute-sanitizer), Python's stacks dumped if it hangs.
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    start_daemon 4GiB || exit 1
    run ref_small_plain 0 --workload reference --small --deterministic --steps 2 --warmup 6 --mark-steps
    budget_of ref_small_plain 0.5 || exit 1
    env -u OFFLOAD_TRACE PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync PYTHONFAULTHANDLER=1 \
        OFFLOAD_DAEMON=connect OFFLOAD_DEVICE_BUDGET="$budget" OFFLOAD_LOG_LEVEL=debug OFFLOAD_TELEMETRY=off \
      "$cs" --tool memcheck --target-processes all --print-limit 100 --report-api-errors no --launch-timeout 300 \
        sh -c 'LD_PRELOAD="$0${LD_PRELOAD:+:$LD_PRELOAD}" exec python3 "$@"' "$lib" "$bench" --workload reference --small \
        --deterministic --steps 2 --warmup 6 --mark-steps --json-out "$work/sanitize_small.json" > "$work/sanitize_small.txt" 2>&1 &
    spid=$!
    for i in $(seq 1 ${SANITIZE_SMALL_S:-150}); do kill -0 $spid 2>/dev/null || break; sleep 1; done
    if kill -0 $spid 2>/dev/null; then
      log "sanitize_small: still running after ${SANITIZE_SMALL_S:-150} s; the processes and their stacks:"
      for p in $(pgrep -f "run.py|compute-sanitizer|python3"); do
        echo "--- pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-200)"
        echo "    state $(awk '{print $3}' /proc/$p/stat) wchan $(cat /proc/$p/wchan 2>/dev/null); threads $(ls /proc/$p/task | wc -l)"
        grep -E 'liboffload|sanitizer|libcuda' /proc/$p/maps 2>/dev/null | awk '{print "    maps " $6}' | sort -u | head -5
        command -v gdb > /dev/null && timeout 30 gdb -p $p -batch -ex 'thread apply all bt 12' 2>/dev/null | grep -E '^#|^Thread' | head -60
      done > "$work/sanitize_small_stacks.txt" 2>&1
      cat "$work/sanitize_small_stacks.txt" | cut -c1-220 | head -120
      pkill -ABRT -f "$bench" ; sleep 5; kill -9 $spid 2>/dev/null
    fi
    wait $spid; log "sanitize_small rc=$?"
    grep -E 'ERROR SUMMARY|\[bench\]|Traceback|File "|Fatal|offload (warn|error)' "$work/sanitize_small.txt" | head -40
    tail -n 25 "$work/sanitize_small.txt" | cut -c1-300
    "$ctl" stop > /dev/null 2>&1
    ;;
  sanitize)
    cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    [ -x "$cs" ] || { log "no compute-sanitizer (PATH, /usr/local/cuda/bin)"; exit 1; }
    "$cs" --version 2>&1 | tee "$work/compute-sanitizer-version.txt"
    start_daemon $host_pool || exit 1
    # The reference workload's small shapes: under memcheck the full ones did not fit on the
    # H200 even without offloading's help (the sanitizer's own allocations took the process to
    # 141 GiB, out of memory in the loss; the plain run needs 25.6 GiB), and under
    # synccheck they did not reach their first plan in 250 s. SANITIZE_SHAPES=full tries them.
    shapes=(--small); [ "${SANITIZE_SHAPES:-small}" = full ] && shapes=()
    run reference_plain 0 --workload reference "${shapes[@]}" --deterministic --steps 4 --warmup 8 --mark-steps
    budget_of reference_plain 0.5 || exit 1
    # sanitize NAME TOOL STEPS: liboffload is preloaded into python only, after whatever the
    # sanitizer preloads itself; offloadd runs outside the sanitizer's tree (start_daemon);
    # CUDA API errors are not reported (the shim's function introspection probes handles, and
    # those probes fill the print limit). CUPTI telemetry is off
    # by default (the sanitizer holds the tools interface; SANITIZE_TELEMETRY=cupti tries it).
    # Each run gets at most 280 s, less when the plan's 570 s would otherwise be exceeded.
    sanitize() {
      local name=$1 tool=$2 steps=$3 limit=$((${SANITIZE_PLAN_S:-570} - SECONDS))
      (( limit > ${SANITIZE_LIMIT_S:-280} )) && limit=${SANITIZE_LIMIT_S:-280}
      (( limit < 30 )) && { log "sanitize $name: no time left"; return 1; }
      log "sanitize $name: --tool $tool, budget $budget, --steps $steps --warmup 8, timeout $limit s"
      local t0=$SECONDS
      env -u OFFLOAD_TRACE PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \
          OFFLOAD_DAEMON=connect OFFLOAD_DEVICE_BUDGET="$budget" OFFLOAD_LOG_LEVEL=info \
          OFFLOAD_TELEMETRY="${SANITIZE_TELEMETRY:-off}" \
        timeout -k 15 "$limit" "$cs" --tool "$tool" --target-processes all --print-limit 100 --report-api-errors no \
          --launch-timeout 300 \
          sh -c 'LD_PRELOAD="$0${LD_PRELOAD:+:$LD_PRELOAD}" exec python3 "$@"' "$lib" "$bench" --workload reference "${shapes[@]}" --deterministic --steps "$steps" --warmup 8 --mark-steps \
          --json-out "$work/$name.json" > "$work/$name.txt" 2>&1
      local rc=$?
      log "  rc=$rc in $((SECONDS - t0)) s$([ $rc = 124 ] && echo ' (timed out)')"
      grep -E 'ERROR SUMMARY' "$work/$name.txt" || log "  no ERROR SUMMARY line"
      grep -E '^\[offload (warn|error)\]|^\[offload info\] ([^:]*: )?plan|\[bench\] (executor|[0-9.]+ ms/step)' \
        "$work/$name.txt" | head -n 8 | cut -c1-600
      [ $rc = 0 ] || tail -n 15 "$work/$name.txt"
      [ -f "$work/$name.json" ] && check_pair reference_plain "$name"
    }
    # (A control without the shim, memcheck on reference --small, reports 0 errors.)
    sanitize sanitize_memcheck memcheck 4
    sanitize sanitize_synccheck synccheck 4
    "$ctl" stop > /dev/null 2>&1
    ;;
  multigpu_smoke | multigpu | multigpu_fsdp)
    # Several GPUs of one node, one offloadd for all ranks (started here, OFFLOAD_DAEMON=connect).
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    ngpu=$(nvidia-smi -L | wc -l)
    n=${MULTIGPU_N:-$ngpu}
    (( n >= 2 )) || { log "$plan: $ngpu GPU(s) here, needs 2 or more"; exit 1; }
    nvidia-smi topo -m > "$work/topo.txt" 2>&1; cat "$work/topo.txt"
    launch="torchrun --standalone --nproc-per-node $n"
    small=(); node_link=()
    if [ "$plan" = multigpu_smoke ]; then
      small=(--small); d=(--deterministic --steps 4 --warmup 8 --mark-steps)
    elif [ "$plan" = multigpu_fsdp ]; then
      d=(--deterministic --steps 20 --warmup 8 --mark-steps)
      [ -n "${MULTIGPU_NODE_LINK:-}" ] && node_link=(--node-link "$MULTIGPU_NODE_LINK")
    else
      d=(--deterministic --steps 20 --warmup 8 --mark-steps)
      python3 "$root/scripts/bench/link.py" --gpus "$n" > "$work/link_multi.json" 2> "$work/link_multi.log"
      cat "$work/link_multi.json"; tail -n 3 "$work/link_multi.log"
      nl=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["node_link"])' "$work/link_multi.json" 2>/dev/null) &&
        node_link=(--node-link "$nl")
    fi
    export OFFLOAD_DAEMON=connect
    start_daemon "$host_pool" "${node_link[@]}" || exit 1
    # status_while NAME: offloadctl status (text and --json) every 2 s while the run goes on.
    sampler=
    status_while() {
      ( i=0; while :; do
          sleep 2; i=$((i + 1))
          { echo "=== sample $i"; "$ctl" status; } >> "$work/$1.status.txt" 2>&1
          "$ctl" status --json > "$work/$1.status.$((i % 2)).json" 2>/dev/null
        done ) & sampler=$!
    }
    pair() {  # pair NAME DIST WORKLOAD FRACTION ARGS...: plain, then offload at FRACTION
      local name=$1 dist=$2 wl=$3 frac=$4; shift 4
      run "${name}_plain" 0 --dist "$dist" --workload "$wl" "${small[@]}" "${d[@]}" "$@"
      budget_of "${name}_plain-rank0" "$frac" || return 1
      status_while "${name}_offload"
      run "${name}_offload" o --dist "$dist" --workload "$wl" "${small[@]}" "${d[@]}" "$@"
      kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
      tail -n 30 "$work/${name}_offload.status.txt"
      for r in $(seq 0 $((n - 1))); do check_pair "${name}_plain-rank$r" "${name}_offload-rank$r"; done
    }
    [ "$plan" = multigpu_fsdp ] || pair ddp ddp reference 0.75
    # FSDP2 with activation checkpointing: what stays is each block's input (64 MiB a block on
    # the reference shapes) and the sharded states; 90% of plain's footprint.
    pair fsdp fsdp reference 0.9 --mode ckpt
    if [ "$plan" = multigpu ] && [ ${#node_link[@]} -gt 0 ]; then
      # The same DDP run planned with the single-GPU link figures (an offloadd without
      # --node-link): how far the prediction is off when the sharing is not modelled. No
      # daemon runs: the ranks start one themselves (OFFLOAD_DAEMON=auto), both at once.
      "$ctl" stop > /dev/null 2>&1; sleep 1
      budget_of ddp_plain-rank0 0.75
      OFFLOAD_DAEMON=auto run ddp_nolink o --dist ddp --workload reference "${d[@]}"
      grep -h -E 'listening|another offloadd|pool' /tmp/liboffload-*/offloadd.log 2>/dev/null | head -n 6 |
        tee "$work/offloadd-auto.log"
      for r in $(seq 0 $((n - 1))); do check_pair "ddp_plain-rank$r" "ddp_nolink-rank$r"; done
    fi
    if [ "$plan" = multigpu ]; then
      # Fair shares: a pool that holds less than the ranks ask for together. Each rank's plan
      # at 75% leased L bytes (host_bytes); a pool of 1.2 L gives each rank 0.6 L.
      lease=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["shim"]["executor"]["host_bytes"])'               "$work/ddp_offload-rank0.json" 2>/dev/null)
      if [ -n "$lease" ] && [ "$lease" -gt 0 ] 2>/dev/null; then
        small_pool=$(( lease * 12 / 10 / (1 << 20) ))MiB
        log "fair shares: rank 0 leased $lease bytes at 75%; a pool of $small_pool for $n ranks"
        cp "$work/offloadd.log" "$work/offloadd-before-share.log"
        start_daemon "$small_pool" "${node_link[@]}" || exit 1
        budget_of ddp_plain-rank0 0.75
        status_while ddp_share
        run ddp_share o --dist ddp --workload reference "${d[@]}"
        kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
        tail -n 30 "$work/ddp_share.status.txt"
        for r in $(seq 0 $((n - 1))); do check_pair "ddp_plain-rank$r" "ddp_share-rank$r"; done
      else
        log "no host_bytes in ddp_offload-rank0.json: fair-share run skipped"
      fi
    fi
    "$ctl" status > "$work/offloadctl-status.txt" 2>&1
    "$ctl" stop > /dev/null 2>&1
    if [ "$plan" = multigpu ]; then
      python3 "$root/scripts/bench/multigpu_report.py" "$work" > "$work/multigpu.md" 2>&1
      cat "$work/multigpu.md"
    fi
    ;;
  weights_20)
    # The hand-written baseline and the shim at the same 20 GiB, back to back: the baseline on
    # PyTorch's native allocator with expandable segments (under backend:cudaMallocAsync its pool
    # reserves 23.88 GiB for 16.47 GiB in use; natively it needs 17.01 GiB), the shim as in
    # `weights`. Resident first, for the ratios and the bitwise reference.
    restart_daemon
    d=(--workload lora --deterministic --steps 6 --warmup 6 --mark-steps)
    # WEIGHTS_20_RESIDENT=0 leaves the resident run out (then the two are checked against each other).
    ref=lora_ckpt
    if [ "${WEIGHTS_20_RESIDENT:-1}" = 1 ]; then run lora_ckpt 0 "${d[@]}" --mode ckpt; else ref=lora_stream_native; fi
    run lora_stream_native 0e "${d[@]}" --mode stream
    [ "$ref" = lora_stream_native ] || check_pair "$ref" lora_stream_native
    budget=20GiB
    OFFLOAD_PERSISTENT_MIN=64MiB run lora_offload_20GiB o "${d[@]}" --mode ckpt
    check_pair "$ref" lora_offload_20GiB
    # The frozen base marked read-only (offload_mark_read_only): copied out once, not after
    # every use. WEIGHTS_20_FROZEN=0 leaves it out.
    if [ "${WEIGHTS_20_FROZEN:-1}" = 1 ]; then
      OFFLOAD_PERSISTENT_MIN=64MiB run lora_offload_20GiB_frozen o "${d[@]}" --mode ckpt --mark-frozen
      check_pair "$ref" lora_offload_20GiB_frozen
    fi
    for n in lora_ckpt lora_stream_native lora_offload_20GiB lora_offload_20GiB_frozen; do
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); w=((r.get("shim") or {}).get("executor") or {}).get("weights"); print("[gpu]", sys.argv[2], round(r["ms_per_step"], 1), "ms/step, footprint", round(r["footprint_peak_bytes"] / 2**30, 2), "GiB, sampled", round((r.get("device_used_peak_bytes") or 0) / 2**30, 2), "GiB", "weights:", json.dumps(w) if w else "")' "$work/$n.json" "$n" 2>/dev/null
    done
    ;;
  weights_20_sampled | weights_20_telemetry)
    # What CUPTI's activity records cost the shim: resident, the baseline, and the shim with the
    # frozen base marked at 20 GiB with CUPTI on every step, then with OFFLOAD_TELEMETRY=sampled
    # (weights_20_sampled: traced while planning and 4 steps in every 64 once the plan runs) or
    # off (weights_20_telemetry: then no weight plan at all). Under 7 min.
    if [ "$plan" = weights_20_sampled ]; then mode=sampled; else mode=off; fi
    restart_daemon
    d=(--workload lora --deterministic --steps 6 --warmup 6 --mark-steps)
    run lora_ckpt 0 "${d[@]}" --mode ckpt
    run lora_stream_native 0e "${d[@]}" --mode stream
    check_pair lora_ckpt lora_stream_native
    budget=20GiB
    OFFLOAD_PERSISTENT_MIN=64MiB run lora_offload_20GiB_frozen o "${d[@]}" --mode ckpt --mark-frozen
    check_pair lora_ckpt lora_offload_20GiB_frozen
    OFFLOAD_TELEMETRY=$mode OFFLOAD_PERSISTENT_MIN=64MiB run "lora_offload_20GiB_frozen_$mode" o "${d[@]}" --mode ckpt --mark-frozen
    check_pair lora_ckpt "lora_offload_20GiB_frozen_$mode"
    for n in lora_ckpt lora_stream_native lora_offload_20GiB_frozen "lora_offload_20GiB_frozen_$mode"; do
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("[gpu]", sys.argv[2], round(r["ms_per_step"], 1), "ms/step, footprint", round(r["footprint_peak_bytes"] / 2**30, 2), "GiB, telemetry", (r.get("shim") or {}).get("telemetry"))' "$work/$n.json" "$n" 2>/dev/null
    done
    ;;
  weights_ab)
    # The hand-written baseline against the shim (frozen base marked, OFFLOAD_TELEMETRY=sampled)
    # at 20 GiB, alternately B S S B so that a drift over the run falls on both arms alike; 12
    # timed steps each, per-step GPU times from events; ab_report.py pools them per arm (< 8 min).
    # WEIGHTS_AB_ARMS picks the runs in order (default "stream_1 shim_1 shim_2 stream_2"):
    # stream_N the baseline, shim_N the shim streaming, floor_N the shim's own floor (the same
    # model resident, 53 GiB, the shim only observing with CUPTI off: route 1n), obs_N the
    # baseline under the shim observing (route 1n), cma_N the baseline under cudaMallocAsync
    # without the shim, shimc_N the shim with OFFLOAD_BLOCK_CACHE. Each arm with two runs is
    # reported against the baseline, the shim against its floor, the observed baseline and
    # shimc_N, the observed against cma_N.
    # An 8-step run takes 70-105 s: five or six fit one run (10 minutes).
    restart_daemon
    d=(--workload lora --deterministic --steps ${WEIGHTS_AB_STEPS:-12} --warmup 6 --mark-steps)
    budget=20GiB
    read -ra arms <<< "${WEIGHTS_AB_ARMS:-stream_1 shim_1 shim_2 stream_2}"
    for n in "${arms[@]}"; do
      case $n in
        stream_*) run "lora_ab_$n" 0e "${d[@]}" --mode stream ;;
        # A floor run before it has started offloadd with the default pool (4 GiB): the shim
        # starts its own, of $host_pool.
        shim_*) restart_daemon
                OFFLOAD_TELEMETRY=sampled OFFLOAD_PERSISTENT_MIN=64MiB run "lora_ab_$n" o "${d[@]}" --mode ckpt --mark-frozen ;;
        floor_*) run "lora_ab_$n" 1n "${d[@]}" --mode ckpt --mark-frozen ;;
        # The baseline in the shim's surroundings: cudaMallocAsync, the shim observing, CUPTI
        # off. Against stream_N, what those surroundings cost it; against shim_N, the two ways
        # of streaming in the same surroundings.
        obs_*) run "lora_ab_$n" 1n "${d[@]}" --mode stream ;;
        # The baseline under cudaMallocAsync alone, no shim: between stream_N and obs_N, what
        # the allocator costs apart from the shim's observing.
        cma_*) run "lora_ab_$n" 0 "${d[@]}" --mode stream ;;
        # The shim with OFFLOAD_BLOCK_CACHE (freed blocks reused on their stream without a
        # stream operation), $WEIGHTS_BLOCK_CACHE at most (default 512MiB: cache_whatif.py on a lora step keeps 59% of the pool operations off the GPU for at most 0.49 GiB more held).
        shimc_*) restart_daemon
                 OFFLOAD_BLOCK_CACHE=${WEIGHTS_BLOCK_CACHE:-512MiB} OFFLOAD_TELEMETRY=sampled OFFLOAD_PERSISTENT_MIN=64MiB \
                   run "lora_ab_$n" o "${d[@]}" --mode ckpt --mark-frozen ;;
        *) log "weights_ab: unknown arm $n (stream_N, shim_N, floor_N, obs_N, cma_N, shimc_N)" ;;
      esac
    done
    first=lora_ab_${arms[0]}
    for n in "${arms[@]:1}"; do check_pair "$first" "lora_ab_$n"; done
    for n in "${arms[@]}"; do
      case $n in
        shim_*|shimc_*) python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); x=r["shim"]["executor"]; print("[gpu]", sys.argv[2], "footprint", round(r["footprint_peak_bytes"] / 2**30, 3), "GiB; host waits, last active step:", json.dumps(x.get("last_step_waits")), "weights:", json.dumps(x.get("weights")), "block cache:", json.dumps(r["shim"].get("block_cache")))' "$work/lora_ab_$n.json" "$n" ;;
      esac
    done
    base=$(runs_of lora_ab_ stream) shim=$(runs_of lora_ab_ shim) floor=$(runs_of lora_ab_ floor) obs=$(runs_of lora_ab_ obs)
    cma=$(runs_of lora_ab_ cma) shimc=$(runs_of lora_ab_ shimc)
    [ -n "$base" ] && [ -n "$shim" ] && python3 "$root/scripts/bench/ab_report.py" --md "$work/weights_ab.md" --a "baseline=$base" --b "shim=$shim"
    [ -n "$base" ] && [ -n "$floor" ] && python3 "$root/scripts/bench/ab_report.py" --md "$work/weights_ab_floor.md" --a "baseline=$base" --b "floor=$floor"
    [ -n "$floor" ] && [ -n "$shim" ] && python3 "$root/scripts/bench/ab_report.py" --md "$work/weights_ab_plan.md" --a "floor=$floor" --b "shim=$shim"
    [ -n "$base" ] && [ -n "$obs" ] && python3 "$root/scripts/bench/ab_report.py" --md "$work/weights_ab_obs.md" --a "baseline=$base" --b "observed=$obs"
    [ -n "$obs" ] && [ -n "$shim" ] && python3 "$root/scripts/bench/ab_report.py" --md "$work/weights_ab_obs_shim.md" --a "observed=$obs" --b "shim=$shim"
    [ -n "$base" ] && [ -n "$cma" ] && python3 "$root/scripts/bench/ab_report.py" --md "$work/weights_ab_cma.md" --a "baseline=$base" --b "cudaMallocAsync=$cma"
    [ -n "$cma" ] && [ -n "$obs" ] && python3 "$root/scripts/bench/ab_report.py" --md "$work/weights_ab_cma_obs.md" --a "cudaMallocAsync=$cma" --b "observed=$obs"
    [ -n "$base" ] && [ -n "$shimc" ] && python3 "$root/scripts/bench/ab_report.py" --md "$work/weights_ab_shimc.md" --a "baseline=$base" --b "shim_cache=$shimc"
    [ -n "$shim" ] && [ -n "$shimc" ] && python3 "$root/scripts/bench/ab_report.py" --md "$work/weights_ab_cache.md" --a "shim=$shim" --b "shim_cache=$shimc"
    ;;
  weights_diag)
    # Where the shim's step goes against the baseline's, kernel by kernel (< 5 min): the baseline
    # observed by the shim (route 1, no budget: traced, CUPTI GPU times, nothing moved; under
    # cudaMallocAsync) and the marked shim at 20 GiB with CUPTI on every step, both traced
    # (OFFLOAD_TRACE, every step). scripts/bench/gaps.py reads the two.
    restart_daemon
    d=(--workload lora --deterministic --steps 6 --warmup 6 --mark-steps)
    # WEIGHTS_DIAG_OBS=0 leaves the observed baseline out.
    [ "${WEIGHTS_DIAG_OBS:-1}" = 1 ] && OFFLOAD_TRACE_LEAD=1 run lora_stream_obs 1 "${d[@]}" --mode stream
    restart_daemon  # the observed run started one with the default pool
    budget=20GiB
    # Each kernel's lead too (OFFLOAD_TRACE_LEAD): gaps_at.py tells the GPU waiting for the host
    # from a launch queued behind a wait.
    OFFLOAD_TRACE_LEAD=1 OFFLOAD_TRACE_STEPS=12 OFFLOAD_PERSISTENT_MIN=64MiB trace_offload=1 run lora_diag_shim o "${d[@]}" --mode ckpt --mark-frozen
    [ -f "$work/lora_stream_obs.json" ] && check_pair lora_stream_obs lora_diag_shim
    python3 "$root/scripts/bench/gaps.py" $(ls -d "$work"/trace_lora_stream_obs 2>/dev/null) "$work/trace_lora_diag_shim" | tee "$work/gaps.txt"
    python3 -c 'import json,sys; x=json.load(open(sys.argv[1]))["shim"]["executor"]; print("[gpu] host waits, last active step:", json.dumps(x.get("last_step_waits")), "weights:", json.dumps(x.get("weights")))' "$work/lora_diag_shim.json"
    rm -f "$work"/trace_*/*.chrome.json  # the step files keep the times; the tarball stays small
    ;;
  sync_cost)
    python3 "$root/scripts/bench/sync_cost.py" --json "$work/sync_cost.json" 2>&1 | tee "$work/sync_cost.log"
    ;;
  power_link)
    python3 "$root/scripts/bench/power_link.py" --json "$work/power_link.json" 2>&1 | tee "$work/power_link.log"
    ;;
  sync_events)
    # The executor's event records and cross-stream waits (sync_cost.py's record,
    # record_side_wait, pipeline; copy_wait_landed beside them), at both shapes (< 2 min).
    for big in "" --big; do
      log "sync_cost event variants ${big:-small}"
      sync_cost_to "sync_events${big:+_big}" -- $big --only copy_wait_landed,record,record_side_wait,pipeline
    done
    ;;
  vmm_use)
    # The GPU's cost of a new mapping to its first reader (sync_cost.py's vmm_first_use against
    # vmm_mapped_once) and of unmapping a range just read (vmm_use_remap), at the small shapes
    # and at lora's, there every 4th GEMM and 9 repeats so that ~10 us a read resolves (< 2 min).
    log "sync_cost vmm variants small"
    sync_cost_to vmm_use -- --only vmm_first_use,vmm_mapped_once,vmm_use_remap
    log "sync_cost vmm variants big"
    sync_cost_to vmm_use_big -- --big --fresh-every 4 --repeat 9 --only vmm_first_use,vmm_mapped_once,vmm_use_remap
    ;;
  pool_ops)
    # What cudaMallocAsync's stream-ordered allocations and frees cost the GPU around every
    # launch (sync_cost.py's pool_ops), at both shapes (< 1 min): the baseline under that
    # backend ran 5-10 ms a step slower than under the native allocator (weights_ab cma_N).
    for big in "" --big; do
      log "sync_cost pool_ops ${big:-small}"
      sync_cost_to "pool_ops${big:+_big}" -- $big --repeat 9 --only pool_ops
    done
    ;;
  sync_cost_shim)
    # The same under the shim (route 1, observing), with CUPTI tracing kernels and copies and
    # then with it off: whether the tracing itself costs the GPU the 15-20 µs a reload that the
    # weights_diag traces show (< 2 min).
    for tm in cupti off; do
      log "sync_cost under the shim, OFFLOAD_TELEMETRY=$tm"
      sync_cost_to "sync_cost_shim_$tm" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync LD_PRELOAD="$lib" \
        OFFLOAD_TELEMETRY=$tm -- --only wait_done,copy_only,copy_wait_landed,vmm_churn_1000
    done
    ;;
  sampled_smoke)
    # OFFLOAD_TELEMETRY=sampled on the marked shim at 20 GiB alone (< 2 min): the pause and
    # resume on real CUPTI; the losses and gradients against the resident lora run's, not a
    # timing comparison.
    restart_daemon
    budget=20GiB
    OFFLOAD_TELEMETRY=sampled OFFLOAD_PERSISTENT_MIN=64MiB run lora_offload_20GiB_frozen_sampled o \
      --workload lora --deterministic --steps 6 --warmup 6 --mark-steps --mode ckpt --mark-frozen
    grep -E "telemetry|plan:|deviat" "$work/lora_offload_20GiB_frozen_sampled.log" | grep -v "^\[bench\] step" | head -n 20
    ;;
  weights)
    # Weight streaming: the lora workload (frozen bf16 base of 40.6 GB,
    # rank-16 adapters, 16384 tokens a step, checkpointed blocks). The resident run fits the
    # H200 and is the reference, bitwise and for the step time; the hand-written baseline
    # streams the blocks' weights through a ring of $WEIGHT_STREAM_RING slots (no shim); the
    # shim streams weights served by its own pool (OFFLOAD_PERSISTENT_MIN) under a budget of
    # 20 GiB, and again at $WEIGHTS_MATCH_BUDGET (default 24 GiB). Small shapes
    # first (the bitwise claim in seconds), then full shapes.
    restart_daemon
    t_plan=$SECONDS
    export WEIGHT_STREAM_RING=${WEIGHT_STREAM_RING:-3}
    log "weight stream ring: $WEIGHT_STREAM_RING slots"
    fails=0
    [ "${WEIGHTS_SKIP_SMALL:-0}" = 1 ] || trace_offload=1 weights_small lora
    d=(--workload lora --deterministic --steps 6 --warmup 6 --mark-steps)
    # WEIGHTS_SKIP_SMALL=1 / WEIGHTS_SKIP_STREAM=1: leave out the small shapes / the baseline.
    run lora_ckpt 0 "${d[@]}" --mode ckpt
    # The baseline on PyTorch's native allocator with expandable segments (WEIGHT_STREAM_KIND=0:
    # backend:cudaMallocAsync instead, whose pool reserves 7 GiB more than the baseline uses).
    [ "${WEIGHTS_SKIP_STREAM:-0}" = 1 ] || { run lora_stream "${WEIGHT_STREAM_KIND:-0e}" "${d[@]}" --mode stream; check_pair lora_ckpt lora_stream || fails=$((fails + 1)); }
    for b in 20GiB ${WEIGHTS_MATCH_BUDGET:-24GiB}; do
      budget=$b
      limit=$(( ${WEIGHTS_PLAN_S:-540} - (SECONDS - t_plan) ))
      if (( limit < 60 )); then
        log "no time left for the shim run at $b ($((SECONDS - t_plan)) s spent)"; fails=$((fails + 1)); continue
      fi
      log "shim run at $b: at most $limit s"
      OFFLOAD_PERSISTENT_MIN=64MiB trace_offload=1 launch="timeout -k 15 $limit python3" run "lora_offload_$b" o "${d[@]}" --mode ckpt
      check_pair lora_ckpt "lora_offload_$b" || fails=$((fails + 1))
      python3 -c 'import json,sys; x=(json.load(open(sys.argv[1])).get("shim") or {}).get("executor") or {}; print("[gpu]   executor:", json.dumps({k: x.get(k) for k in ("plan","installs","deviations","steps_active","misses","evictions","reloads","weights","planner")})[:1500])' \
        "$work/lora_offload_$b.json" 2>/dev/null || log "  no result"
    done
    # Sizes, footprints against the budget, and step times against the resident run.
    python3 - "$work" <<'PY'
import glob, json, os, sys
def load(name):
    path = os.path.join(sys.argv[1], name + ".json")
    return json.load(open(path)) if os.path.exists(path) else None
g = lambda v: f"{v / 2**30:.2f} GiB" if isinstance(v, (int, float)) else "n/a"
names = ["lora_small_ckpt", "lora_small_stream", "lora_small_offload", "lora_ckpt", "lora_stream"]
names += sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(sys.argv[1], "lora_offload_*.json")))
for name in names:
    r = load(name)
    if r is None:
        print(f"[gpu] {name}: no result"); continue
    ws = r.get("weight_stream") or {}
    ref = load("lora_small_ckpt") if r["small"] else load("lora_ckpt")
    ratio = f"{r['ms_per_step'] / ref['ms_per_step']:.3f}x resident" if ref else "n/a"
    ex = ((r.get("shim") or {}).get("executor") or {})
    pl = ex.get("planner") or {}
    pred = pl.get("predicted_step_ns") or 0
    gpu = [s.get("gpu_step_ns") for s in ((r.get("shim") or {}).get("recent_steps") or []) if (s.get("gpu_step_ns") or 0) > 0]
    print(f"[gpu] {name}: params {r.get('params')} trainable {r.get('trainable_params')}; "
          f"{r['ms_per_step']:.1f} ms/step ({ratio}); footprint {g(r.get('footprint_peak_bytes'))} "
          f"(sampled in use {g(r.get('device_used_peak_bytes'))})"
          + (f"; budget {g(ex.get('budget'))}" if ex.get("budget") else "")
          + (f"; predicted {pred / 1e6:.1f} ms/step" if pred else "")
          + (f"; ring {ws['ring']} x {g(ws['slot_bytes'])}, {g(ws['h2d_bytes_per_step'])} H2D a step" if ws else ""))
PY
    "$ctl" stop > /dev/null 2>&1
    log "weights: bitwise $([ $fails = 0 ] && echo PASS || echo "FAIL ($fails)") (plan took $((SECONDS - t_plan)) s)"
    ;;
  weights_moe)
    # Weight streaming on the moe workload (a mixture-of-experts transformer, frozen bf16 weights
    # of 38.7 GiB, LoRA adapters on attention, 16384 tokens a step, checkpointed blocks), where a
    # block's weights carry 0.41 of a dense block's GEMM work per byte (< 10 min):
    # small shapes first (resident, baseline, shim: bitwise in seconds), then the resident run
    # (the reference; MOE_SKIP_SMALL=1 leaves the small shapes out), and $MOE_ARMS in order (default "stream_1 shim_1 shim_2 stream_2"):
    # stream_N the hand-written baseline on PyTorch's native allocator, keep_N the same keeping as
    # many blocks resident as 20 GiB leaves room for, shim_N the shim at 20 GiB
    # as weights_ab's shimc arm (frozen base marked, OFFLOAD_TELEMETRY=sampled, OFFLOAD_BLOCK_CACHE),
    # with OFFLOAD_PERSISTENT_MIN=32MiB (the attention's output projection is 32 MiB, an expert's
    # weight 64 MiB). ab_report.py on the arms with two runs.
    restart_daemon
    t_plan=$SECONDS
    export WEIGHT_STREAM_RING=${WEIGHT_STREAM_RING:-3}
    fails=0
    [ "${MOE_SKIP_SMALL:-0}" = 1 ] || weights_small moe --mark-frozen
    restart_daemon
    d=(--workload moe --deterministic --steps ${MOE_STEPS:-8} --warmup ${MOE_WARMUP:-6} --mark-steps)
    run moe_ckpt 0 "${d[@]}" --mode ckpt
    budget=20GiB
    read -ra arms <<< "${MOE_ARMS:-stream_1 shim_1 shim_2 stream_2}"
    for n in "${arms[@]}"; do
      if (( SECONDS - t_plan > ${MOE_PLAN_S:-470} )); then log "no time left for moe_$n"; fails=$((fails + 1)); continue; fi
      case $n in
        stream_*) restart_daemon; run "moe_$n" 0e "${d[@]}" --mode stream ;;
        # The baseline keeping as many blocks resident as the budget leaves room for beside its
        # ring (from the first stream run's footprint; $MOE_KEEP to set it).
        keep_*) restart_daemon
                keep=${MOE_KEEP:-$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); ws=r["weight_stream"]; print(max(0, min(ws["blocks"] - 2, int((20 * 2**30 - r["footprint_peak_bytes"]) // ws["slot_bytes"]))))' "$work/moe_stream_1.json" 2>/dev/null)}
                [ -n "$keep" ] || { log "no moe_stream_1 result: no block count to keep"; continue; }
                log "baseline keeping $keep blocks resident"
                WEIGHT_STREAM_KEEP=$keep run "moe_$n" 0e "${d[@]}" --mode stream ;;
        # MOE_TRACE=1: the first shim run records the step its plan is made from too (for offloadctl
        # plan without a GPU; a few MiB, and the results come back as one file of at most 16 MiB).
        shim_*) restart_daemon
                t_o=0; [ "${MOE_TRACE:-0}" = 1 ] && [ "$n" = shim_1 ] && t_o=1
                OFFLOAD_TRACE_STEPS=1 OFFLOAD_BLOCK_CACHE=${WEIGHTS_BLOCK_CACHE:-512MiB} OFFLOAD_TELEMETRY=sampled \
                  OFFLOAD_PERSISTENT_MIN=32MiB trace_offload=$t_o run "moe_$n" o "${d[@]}" --mode ckpt --mark-frozen
                python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); x=r["shim"]["executor"]; p=x.get("planner") or {}; print("[gpu]  ", sys.argv[2], "footprint %.2f GiB" % (r["footprint_peak_bytes"] / 2**30), "predicted", p.get("predicted_step_ns"), "weights:", json.dumps(x.get("weights")), "misses", x.get("recent_misses"), "block cache:", json.dumps(r["shim"].get("block_cache")))' \
                  "$work/moe_$n.json" "$n" 2>/dev/null || log "  no result for moe_$n" ;;
        *) log "weights_moe: unknown arm $n (stream_N, keep_N, shim_N)"; continue ;;
      esac
      check_pair moe_ckpt "moe_$n" || fails=$((fails + 1))
    done
    python3 - "$work" <<'PY'
import json, os, sys
def load(name):
    path = os.path.join(sys.argv[1], name + ".json")
    return json.load(open(path)) if os.path.exists(path) else None
ref = load("moe_ckpt")
for name in sorted(f[:-5] for f in os.listdir(sys.argv[1]) if f.startswith("moe_") and f.endswith(".json")):
    r = load(name)
    ws = r.get("weight_stream") or {}
    ex = ((r.get("shim") or {}).get("executor") or {})
    pred = (ex.get("planner") or {}).get("predicted_step_ns") or 0
    ratio = f"{r['ms_per_step'] / ref['ms_per_step']:.3f}x resident" if ref and not r["small"] else ""
    print(f"[gpu] {name}: {r['ms_per_step']:.1f} ms/step {ratio}; footprint {r['footprint_peak_bytes'] / 2**30:.2f} GiB"
          + (f"; predicted {pred / 1e6:.1f} ms" if pred else "")
          + (f"; ring {ws['ring']} x {ws['slot_bytes'] / 2**30:.2f} GiB, {ws.get('kept_blocks', 0)} blocks kept, {ws['h2d_bytes_per_step'] / 2**30:.2f} GiB H2D a step" if ws else ""))
PY
    base=$(runs_of moe_ stream) shim=$(runs_of moe_ shim) kept=$(runs_of moe_ keep)
    [ -n "$base" ] && [ -n "$shim" ] && python3 "$root/scripts/bench/ab_report.py" --md "$work/moe_ab.md" --a "baseline=$base" --b "shim=$shim"
    [ -n "$kept" ] && [ -n "$shim" ] && python3 "$root/scripts/bench/ab_report.py" --md "$work/moe_ab_keep.md" --a "baseline_keep=$kept" --b "shim=$shim"
    "$ctl" stop > /dev/null 2>&1
    log "weights_moe: bitwise $([ $fails = 0 ] && echo PASS || echo "FAIL ($fails)") ($((SECONDS - t_plan)) s)"
    ;;
  persistent)
    # PersistentPool on the GPU: every
    # allocation of at least $min bytes in a range of its own, kept by size and handed out
    # again. No budget: nothing is evicted; the run must match plain bit for bit, and a warm
    # step should make no driver call (reused ~ allocs after the first steps).
    d=(--deterministic --steps 20 --warmup 8 --mark-steps)
    for shape in small full; do
      sz=(); min=32MiB
      [ $shape = small ] && sz=(--small) && min=2MiB
      run "persistent_${shape}_plain" 0 --workload reference "${sz[@]}" "${d[@]}"
      OFFLOAD_PERSISTENT_MIN=$min run "persistent_${shape}" 1n --workload reference "${sz[@]}" "${d[@]}"
      check_pair "persistent_${shape}_plain" "persistent_${shape}"
      python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("[gpu]   persistent pool:", json.dumps((r.get("shim") or {}).get("persistent")))' \
        "$work/persistent_${shape}.json" 2>/dev/null || log "  no result"
    done
    ;;
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
