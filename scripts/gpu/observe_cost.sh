#!/usr/bin/env bash
# What watching costs: each workload (scripts/bench/budget.py: the held-out families and the
# scripts/bench workloads, SCALE=small by default) run plain, under the shim as a user who only
# watches gets it (no budget: light observation), and with OFFLOAD_OBSERVE=full (every launch
# scanned, CUPTI on), one after the other, ROUNDS times (alternated). Median step time of the
# steps after the first STEPS/3. Needs .carry/bin from scripts/gpu/prepare.sh.
#   scripts/gpu/observe_cost.sh [WORKLOAD...]      leaves $OUT/observe/*.json and observe.md
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}/observe; mkdir -p "$out"
lib=$root/.carry/bin/liboffload.so
steps=${STEPS:-30} scale=${SCALE:-small} rounds=${ROUNDS:-1} start=$SECONDS
[ $# -gt 0 ] || set -- hf_llama resnet50 lstm embed_cat compiled_mlp reference convnet llama lora moe
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
arm() {  # arm TAG WORKLOAD ROUND [VAR=value...]
  local tag=$1 w=$2 r=$3; shift 3
  env "$@" timeout 300 python3 "$root/scripts/bench/budget.py" --workload "$w" --scale "$scale" --steps "$steps" \
    --no-shim-stats --out "$out/$w-$tag-$r.json" > "$out/$w-$tag-$r.log" 2>&1 || echo "$w $tag round $r: failed ($?)"
}
for w in "$@"; do
  for r in $(seq 1 "$rounds"); do
    if [ $((SECONDS - start)) -gt "${DEADLINE:-500}" ]; then echo "skipped $w round $r: past the deadline"; continue; fi
    arm plain "$w" "$r"
    arm light "$w" "$r" LD_PRELOAD="$lib"
    arm full "$w" "$r" LD_PRELOAD="$lib" OFFLOAD_OBSERVE=full
  done
done
python3 - "$out" "$steps" <<'PY' | tee "$out/observe.md"
import glob, json, os, statistics, sys
out, steps = sys.argv[1], int(sys.argv[2])
runs, modes = {}, set()
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    w, tag, _ = os.path.basename(f)[:-5].rsplit("-", 2)
    r = json.load(open(f))
    ms = r.get("step_ms", [])[steps // 3:]
    if ms:
        runs.setdefault(w, {}).setdefault(tag, []).append(statistics.median(ms))
    shim = r.get("offload") or {}
    if shim:
        modes.add((tag, shim.get("observe"), shim.get("telemetry"), (shim.get("counters") or {}).get("kernels", 0) > 0))
print("| workload | plain ms | watched (light) ms | cost | full observation ms | cost |")
print("|---|---:|---:|---:|---:|---:|")
for w, t in runs.items():
    p = statistics.median(t.get("plain", [0])) or float("nan")
    row = [w, f"{p:.2f}"]
    for tag in ("light", "full"):
        v = statistics.median(t[tag]) if tag in t else float("nan")
        row += [f"{v:.2f}", f"{(v / p - 1) * 100:+.1f}%"]
    print("| " + " | ".join(row) + " |")
print()
for m in sorted(modes, key=str):
    print(f"- {m[0]}: observe {m[1]}, telemetry {m[2]}, launches scanned: {m[3]}")
PY
