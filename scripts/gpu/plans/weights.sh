# Weight-streaming plans: lora and moe, the hand-written baseline against the shim.
# Sourced by scripts/gpu/run.sh: the plans use its helpers (run, budget_of, check_pair, ...)
# and its variables ($work, $root, $ctl, $budget, ...), which they read or set for the helpers.
# shellcheck shell=bash disable=SC2034,SC2154

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

# weights: lora resident, the hand-written baseline, the shim at 20 GiB and $WEIGHTS_MATCH_BUDGET
plan_weights() {
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
}

# weights_moe: the moe workload resident, then the baseline and the shim alternated ($MOE_ARMS)
plan_weights_moe() {
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
}

# weights_20: the baseline and the shim at 20 GiB back to back, then the frozen base marked
plan_weights_20() {
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
}

# weights_20_telemetry and weights_20_sampled ($plan): what CUPTI costs the marked shim
plan_weights_20_telemetry() {
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
}

# weights_ab: the baseline against the marked shim, alternated arms ($WEIGHTS_AB_ARMS); ab_report.py
plan_weights_ab() {
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
}

# weights_diag: the baseline observed and the marked shim at 20 GiB, both traced; gaps.py
plan_weights_diag() {
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
}

# sampled_smoke: the marked shim alone with OFFLOAD_TELEMETRY=sampled, bitwise
plan_sampled_smoke() {
  # OFFLOAD_TELEMETRY=sampled on the marked shim at 20 GiB alone (< 2 min): the pause and
  # resume on real CUPTI; the losses and gradients against the resident lora run's, not a
  # timing comparison.
  restart_daemon
  budget=20GiB
  OFFLOAD_TELEMETRY=sampled OFFLOAD_PERSISTENT_MIN=64MiB run lora_offload_20GiB_frozen_sampled o \
    --workload lora --deterministic --steps 6 --warmup 6 --mark-steps --mode ckpt --mark-frozen
  grep -E "telemetry|plan:|deviat" "$work/lora_offload_20GiB_frozen_sampled.log" | grep -v "^\[bench\] step" | head -n 20
}
