# Plans that measure what single GPU operations cost (sync_cost.py, power_link.py).
# Sourced by scripts/gpu/run.sh: the plans use its helpers (run, budget_of, check_pair, ...)
# and its variables ($work, $root, $ctl, $budget, ...), which they read or set for the helpers.
# shellcheck shell=bash disable=SC2034,SC2154

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

# sync_cost: the GPU time of a cross-stream wait, a copy and the driver's map/unmap while kernels run
plan_sync_cost() {
  python3 "$root/scripts/bench/sync_cost.py" --json "$work/sync_cost.json" 2>&1 | tee "$work/sync_cost.log"
}

# sync_events: the executor's event records and cross-stream waits, at both shapes
plan_sync_events() {
  # The executor's event records and cross-stream waits (sync_cost.py's record,
  # record_side_wait, pipeline; copy_wait_landed beside them), at both shapes (< 2 min).
  for big in "" --big; do
    log "sync_cost event variants ${big:-small}"
    sync_cost_to "sync_events${big:+_big}" -- $big --only copy_wait_landed,record,record_side_wait,pipeline
  done
}

# vmm_use: a fresh mapping's first use and the unmap of a range just read
plan_vmm_use() {
  # The GPU's cost of a new mapping to its first reader (sync_cost.py's vmm_first_use against
  # vmm_mapped_once) and of unmapping a range just read (vmm_use_remap), at the small shapes
  # and at lora's, there every 4th GEMM and 9 repeats so that ~10 us a read resolves (< 2 min).
  log "sync_cost vmm variants small"
  sync_cost_to vmm_use -- --only vmm_first_use,vmm_mapped_once,vmm_use_remap
  log "sync_cost vmm variants big"
  sync_cost_to vmm_use_big -- --big --fresh-every 4 --repeat 9 --only vmm_first_use,vmm_mapped_once,vmm_use_remap
}

# pool_ops: cudaMallocAsync's stream-ordered allocations and frees around every launch
plan_pool_ops() {
  # What cudaMallocAsync's stream-ordered allocations and frees cost the GPU around every
  # launch (sync_cost.py's pool_ops), at both shapes (< 1 min): the baseline under that
  # backend ran 5-10 ms a step slower than under the native allocator (weights_ab cma_N).
  for big in "" --big; do
    log "sync_cost pool_ops ${big:-small}"
    sync_cost_to "pool_ops${big:+_big}" -- $big --repeat 9 --only pool_ops
  done
}

# power_link: lora's GEMMs alone and beside host-to-device copies, at the power cap
plan_power_link() {
  python3 "$root/scripts/bench/power_link.py" --json "$work/power_link.json" 2>&1 | tee "$work/power_link.log"
}

# sync_cost_shim: sync_cost.py under the shim, CUPTI on and off
plan_sync_cost_shim() {
  # The same under the shim (route 1, observing), with CUPTI tracing kernels and copies and
  # then with it off: whether the tracing itself costs the GPU the 15-20 µs a reload that the
  # weights_diag traces show (< 2 min).
  for tm in cupti off; do
    log "sync_cost under the shim, OFFLOAD_TELEMETRY=$tm"
    sync_cost_to "sync_cost_shim_$tm" PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync LD_PRELOAD="$lib" \
      OFFLOAD_TELEMETRY=$tm -- --only wait_done,copy_only,copy_wait_landed,vmm_churn_1000
  done
}
