# Plans under compute-sanitizer: an offloaded run under memcheck and synccheck.
# Sourced by scripts/gpu/run.sh: the plans use its helpers (run, budget_of, check_pair, ...)
# and its variables ($work, $root, $ctl, $budget, ...), which they read or set for the helpers.
# shellcheck shell=bash disable=SC2034,SC2154

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
