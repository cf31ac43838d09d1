# The plans on several GPUs of one node (torchrun, one offloadd for all ranks).
# Sourced by scripts/gpu/run.sh: the plans use its helpers (run, budget_of, check_pair, ...)
# and its variables ($work, $root, $ctl, $budget, ...), which they read or set for the helpers.
# shellcheck shell=bash disable=SC2034,SC2154

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
