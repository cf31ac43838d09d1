# Plans of the offload executor, its GPU-time planner and the shim's pools, and under
# compute-sanitizer (an offloaded run under memcheck and synccheck).
# Sourced by scripts/gpu/run.sh: the plans use its helpers (run, budget_of, check_pair, ...)
# and its variables ($work, $root, $ctl, $budget, ...), which they read or set for the helpers.
# shellcheck shell=bash disable=SC2034,SC2154

# For the plans that measure the plan of arenas, as their tables in docs/results.md do (not the
# hard cap, which a budget otherwise means): OFFLOAD_CAP=0 unless set, and offloadd started
# afresh with the runs' pool and left to fault it in, as a node's daemon would have.
arenas_daemon() {
  export OFFLOAD_CAP=${OFFLOAD_CAP:-0}
  start_daemon "$host_pool" || exit 1
  wait_pool_faulted 120
}

# executor_smoke: the reference plain and at 50% of plain's footprint, small and full, bitwise
plan_executor_smoke() {
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
}

# executor and executor_compiled ($plan): every workload plain vs offload, or only llama --compile
plan_executor() {
  # Every workload, deterministic, 40 warm-up + 20 timed steps (all 60 losses compared);
  # save_on_cpu (about 1 s/step on the reference) runs 2 + 5.
  # executor_compiled: only the compiled Llama pair (for when executor had to skip it).
  # 40 warm-up steps: a plan goes in once the host memory it leased is pinned (the reference's
  # 16 GiB take seconds: about 20 steps), and the peaks must be reset after it (docs/results.md).
  arenas_daemon
  t_plan=$SECONDS
  d=(--deterministic --steps 20 --warmup ${EXECUTOR_WARMUP:-40} --mark-steps)
  # $EXECUTOR_WORKLOADS: some of reference, convnet and llama (all by default).
  local only=" ${EXECUTOR_WORKLOADS:-reference convnet llama} "
  if [ "$plan" = executor ]; then
    if [[ $only == *" reference "* ]]; then
      run reference_plain 0 --workload reference "${d[@]}"
      run reference_ckpt 0 --workload reference --mode ckpt "${d[@]}"
      run reference_save_on_cpu 0 --workload reference --mode save_on_cpu --deterministic --steps 5 --warmup 2
      budget_of reference_plain "$(executor_fraction reference)" && run reference_offload o --workload reference "${d[@]}"
    fi
    for w in convnet llama; do
      [[ $only == *" $w "* ]] || continue
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
}

# pool_trim: the pool after the plan as a training script leaves it (--keep-pool), bitwise
plan_pool_trim() {
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
}

# cache_workloads: OFFLOAD_BLOCK_CACHE on the reference, convnet and Llama workloads
plan_cache_workloads() {
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
}

# planner: the GPU-time planner on the reference workload; planner_report.py -> planner.md
plan_planner() {
  # The GPU-time planner on the reference workload, side by side in one run: plain, ckpt,
  # save_on_cpu, and offload at 90%, 75% and 50% of plain's footprint and at the largest
  # offload the planner says the compute hides (its predicted footprint as the budget).
  # The link is measured first (pinned copies, each way and both at once).
  arenas_daemon
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
}

# planner_diag: the reference at 75% and 50%, traced with transfers; link_use.py
plan_planner_diag() {
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
}

# refine: PoolRefine on the reference, then with --keep-pool and without marks
plan_refine() {
  # PoolRefine (OFFLOAD_POOL_REFINE): the pool's factor measured under the plan and the plan
  # made again for it, put in at a step's mark. The reference at 90/75/50% of plain's footprint
  # with it, 75% without it, 20 warm-up steps (the plan made again goes in about 6 steps after
  # the first); then, as a training script leaves the pool (--keep-pool), the reference at 50%
  # and llama at 75%. planner_report.py on the first group.
  arenas_daemon
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
}

# persistent: OFFLOAD_PERSISTENT_MIN on the GPU, no budget, against plain
plan_persistent() {
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
}


# sanitize_small: memcheck on a small offloaded run (diagnosis)
plan_sanitize_small() {
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
}

# sanitize: compute-sanitizer memcheck, then synccheck, on an offloaded reference run
plan_sanitize() {
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
}
