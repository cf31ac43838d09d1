#!/usr/bin/env bash
# What watching costs: each workload (scripts/bench/budget.py: the held-out families and the
# scripts/bench workloads, SCALE=small by default) run plain, under the shim as a user who only
# watches gets it (no budget: light observation), and with OFFLOAD_OBSERVE=full (every launch
# scanned, CUPTI on), one after the other, ROUNDS times (alternated). Median step time of the
# steps after the first STEPS/3, then the median over rounds; no sampling thread and no reading
# of the shim's counters during the steps. ARMS="plain off light full" adds `off`: preloaded
# with OFFLOAD_DISABLE=1, the hooks forwarding alone (what interposing costs by itself). The
# workloads `launches` and `allocs` do 2000 of one operation a step: their cost is also given
# per operation. The arm `ab` runs light observation paused on every other step
# (offload_pause_observation) and compares the two halves inside one process: the hooks' cost
# without the noise between processes (the worker runs in both halves). Needs .carry/bin from
# scripts/gpu/prepare.sh.
#   scripts/gpu/observe_cost.sh [WORKLOAD...]      leaves $OUT/observe/*.json and observe.md
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}/observe; mkdir -p "$out"
lib=$root/.carry/bin/liboffload.so
steps=${STEPS:-30} scale=${SCALE:-small} rounds=${ROUNDS:-1} start=$SECONDS arms=${ARMS:-plain light full}
[ $# -gt 0 ] || set -- hf_llama resnet50 lstm embed_cat compiled_mlp reference convnet llama lora moe
export PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
# Every arm runs on the same few CPUs of the GPU's own NUMA node (PIN_CPUS, else the first four
# of the GPU's local_cpulist): unpinned, arms that run the same code moved by up to 30% a step.
cpus=${PIN_CPUS:-$(python3 - <<'PY'
import subprocess
try:
    bus = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader", "-i", "0"],
                         capture_output=True, text=True).stdout.strip().lower()[-12:]
    spec = open(f"/sys/bus/pci/devices/{bus}/local_cpulist").read().strip()
    cpus = []
    for part in spec.split(","):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    print(",".join(map(str, cpus[:4])))
except Exception:
    print("")
PY
)}
echo "arms pinned to CPUs: ${cpus:-none (not found)}"
arm() {  # arm TAG WORKLOAD ROUND [VAR=value...] [-- budget.py ARGS]
  local tag=$1 w=$2 r=$3 vars=() extra=(); shift 3
  while [ $# -gt 0 ] && [ "$1" != -- ]; do vars+=("$1"); shift; done
  [ $# -gt 0 ] && { shift; extra=("$@"); }
  env "${vars[@]}" timeout 300 ${cpus:+taskset -c "$cpus"} python3 "$root/scripts/bench/budget.py" --workload "$w" --scale "$scale" --steps "$steps" \
    --no-shim-stats --sample-ms 0 "${extra[@]}" --out "$out/$w-$tag-$r.json" > "$out/$w-$tag-$r.log" 2>&1 || echo "$w $tag round $r: failed ($?)"
}
for w in "$@"; do
  for r in $(seq 1 "$rounds"); do
    if [ $((SECONDS - start)) -gt "${DEADLINE:-500}" ]; then echo "skipped $w round $r: past the deadline"; continue; fi
    for a in $arms; do
      case $a in
        plain) arm plain "$w" "$r" ;;
        off) arm off "$w" "$r" LD_PRELOAD="$lib" OFFLOAD_DISABLE=1 ;;
        light) arm light "$w" "$r" LD_PRELOAD="$lib" ;;
        full) arm full "$w" "$r" LD_PRELOAD="$lib" OFFLOAD_OBSERVE=full ;;
        ab) arm ab "$w" "$r" LD_PRELOAD="$lib" -- --ab-pause ;;
      esac
    done
  done
done
python3 - "$out" "$steps" "$arms" <<'PY' | tee "$out/observe.md"
import glob, json, os, statistics, sys
out, steps, arms = sys.argv[1], int(sys.argv[2]), [a for a in sys.argv[3].split() if a != "plain"]
names = {"off": "preloaded, disabled", "light": "watched (light)", "full": "full observation"}
arms = [a for a in arms if a != "ab"]
runs, modes, counts, ab = {}, set(), {}, {}
for f in sorted(glob.glob(os.path.join(out, "*.json"))):
    w, tag, _ = os.path.basename(f)[:-5].rsplit("-", 2)
    r = json.load(open(f))
    ms = r.get("step_ms", [])[steps // 3:]
    if tag == "ab" and r.get("paused_steps"):
        paused = r["paused_steps"][steps // 3:]
        on = [m for m, p in zip(ms, paused) if not p]
        off = [m for m, p in zip(ms, paused) if p]
        if on and off:
            ab.setdefault(w, []).append((statistics.median(off), statistics.median(on)))
    elif ms:
        runs.setdefault(w, {}).setdefault(tag, []).append(statistics.median(ms))
    m = r.get("shim_mode")
    if m:
        modes.add((tag, m["observe"], m["telemetry"], m["scanned"] > 0))
        seen = r.get("steps", 0) - sum(r.get("paused_steps", []))  # paused steps are not counted
        if tag in ("light", "ab") and seen > 0:
            counts[w] = ((m["unscanned"] or 0) / seen, (m.get("allocs") or 0) / seen)
if runs:
    print("| workload | plain ms | " + " | ".join(f"{names[a]} ms | cost" for a in arms) + " |")
    print("|---|---:|" + "---:|---:|" * len(arms))
for w, t in runs.items():
    p = statistics.median(t.get("plain", [0])) or float("nan")
    row = [w, f"{p:.2f}"]
    for tag in arms:
        v = statistics.median(t[tag]) if tag in t else float("nan")
        cost = f"{(v / p - 1) * 100:+.1f}%"
        if w in ("launches", "allocs"):  # 2000 operations a step
            cost += f" ({(v - p) / 2000 * 1e3:+.2f} us each)"
        row += [f"{v:.2f}", cost]
    print("| " + " | ".join(row) + " |")
print()
if ab:
    print()
    print("| workload | paused steps ms | watched steps ms (light) | cost |")
    print("|---|---:|---:|---:|")
    for w, pairs in ab.items():
        p = statistics.median(x for x, _ in pairs)
        o = statistics.median(y for _, y in pairs)
        print(f"| {w} | {p:.2f} | {o:.2f} | {(o / p - 1) * 100:+.1f}% |")
    print()
for w, (l, n) in sorted(counts.items()):
    print(f"- {w}: {l:.0f} launches and {n:.0f} allocations a step")
for m in sorted(modes, key=str):
    print(f"- {m[0]}: observe {m[1]}, telemetry {m[2]}, launches scanned: {m[3]}")
PY
cp "$out/observe.md" "$out/../observe.md"
tar czf "$out.tgz" -C "$(dirname "$out")" observe && rm -rf "$out"
