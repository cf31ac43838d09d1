# Plans that observe without offloading (the workloads under the shim, determinism, cost, traces),
# that measure what single GPU operations cost (sync_cost.py, power_link.py), and on several GPUs
# of one node (torchrun, one offloadd for all ranks).
# Sourced by scripts/gpu/run.sh: the plans use its helpers (run, budget_of, check_pair, ...)
# and its variables ($work, $root, $ctl, $budget, ...), which they read or set for the helpers.
# shellcheck shell=bash disable=SC2034,SC2154

# smoke: every workload, small shapes, under the shim
plan_smoke() {
  run ref_small_r1 1 --workload reference --small --steps 8 --warmup 2
  run ref_small_r2 2 --workload reference --small --steps 8 --warmup 2
  run conv_small_r1 1 --workload convnet --small --steps 8 --warmup 2
  run llama_small_r1 1 --workload llama --small --steps 8 --warmup 2
  run llama_small_compile_r1 1 --workload llama --small --compile --steps 8 --warmup 3
}

# reference: determinism, shim on both routes, cost of observing, baselines
plan_reference() {
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
}

# conv_llama: the same for the convnet and the Llama-from-config model
plan_conv_llama() {
  for w in convnet llama; do
    run ${w}_det_a 0 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_det_b 0 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_det_r1 1 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_det_r2 2 --workload $w --steps 10 --warmup 3 --deterministic
    run ${w}_ckpt 0 --workload $w --mode ckpt --steps 10 --warmup 3
    run ${w}_save_on_cpu 0 --workload $w --mode save_on_cpu --steps 5 --warmup 2
  done
}

# all_eager: reference (determinism, shim, cost) + conv_llama, in one run
plan_all_eager() {
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
}

# compiled: the Llama model under torch.compile
plan_compiled() {
  run llamac_det_a 0 --workload llama --compile --steps 8 --warmup 4 --deterministic
  run llamac_det_b 0 --workload llama --compile --steps 8 --warmup 4 --deterministic
  run llamac_det_r1 1 --workload llama --compile --steps 8 --warmup 4 --deterministic
  run llamac_det_r2 2 --workload llama --compile --steps 8 --warmup 4 --deterministic
}

# traces: record the step traces kept in tests/data/traces/
plan_traces() {
  # Record the step traces that tests/data/traces/ keeps (with GPU times).
  run reference_det_r1 1 --workload reference --steps 10 --warmup 3 --deterministic
  run convnet_det_r1 1 --workload convnet --steps 10 --warmup 3 --deterministic
  run llamac_det_r1 1 --workload llama --compile --steps 8 --warmup 4 --deterministic
}

# final: visibility, event timing (CUPTI off / taken over), offloadd
plan_final() {
  # The shim as committed: CUPTI visibility, event timing with CUPTI off, event timing
  # after torch.profiler takes CUPTI over, and the offloadd the shim starts itself.
  run reference_det_r1 1 --workload reference --steps 10 --warmup 3 --deterministic
  run reference_nocupti 1n --workload reference --steps 10 --warmup 3
  run reference_profiled 1 --workload reference --steps 20 --warmup 3 --profile
  "$bin/offloadctl" status > "$work/offloadctl-status.txt" 2>&1; cat "$work/offloadctl-status.txt"
  "$bin/offloadctl" stop
}

# cost: cost of observing: reference and convnet, CUPTI on and off
plan_cost() {
  # Where the launch-bound convnet's overhead goes: the shim with and without CUPTI.
  run convtime_plain 0 --workload convnet --steps 20 --warmup 3
  run convtime_shim 1 --workload convnet --steps 20 --warmup 3
  run convtime_shim_nocupti 1n --workload convnet --steps 20 --warmup 3
  run reftime_plain_2 0 --workload reference --steps 30 --warmup 5
  run reftime_shim_2 1 --workload reference --steps 30 --warmup 5
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


# multigpu_smoke, multigpu and multigpu_fsdp ($plan): DDP and FSDP2 under one offloadd
plan_multigpu() {
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
}
