#!/usr/bin/env bash
# The recorded traces on a GPU machine: a short run of the reference workload (small) with
# OFFLOAD_TRACE and full observation. Checks that the shim found CUPTI (telemetry "cupti"), that
# each step file's base time (Unix ns) lies inside the run's wall-clock span and grows step by
# step, and that `offloadctl trace chrome` makes one trace of them with demangled names (under
# 1% left mangled: a few cutlass names defeat __cxa_demangle and c++filt alike).
# Needs .carry/bin from scripts/gpu/prepare.sh. Leaves $OUT/trace_check.txt and steps.json.gz.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
out=${OUT:-/tmp/out}; mkdir -p "$out"
bin=$root/.carry/bin
dir=$(mktemp -d)/trace
t0=$(date +%s%N)
LD_PRELOAD=$bin/liboffload.so PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync OFFLOAD_TRACE=$dir OFFLOAD_DAEMON=off \
  timeout 300 python3 "$root/scripts/bench/run.py" --workload reference --small --mode plain --steps 12 --warmup 2 \
  > "$out/trace_check.log" 2>&1
t1=$(date +%s%N)
"$bin/offloadctl" trace chrome "$dir" -o "$out/steps.json" 2>> "$out/trace_check.log"
python3 - "$dir" "$t0" "$t1" "$out/steps.json" "$out/trace_check.log" <<'PY' | tee "$out/trace_check.txt"
import glob, json, re, sys
d, t0, t1, chrome, logf = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
ok = True
def check(what, cond):
    global ok
    ok &= bool(cond)
    print(("ok   " if cond else "FAIL ") + what)
res = [l for l in open(logf) if l.startswith("RESULT ")]
tele = json.loads(res[-1][7:]).get("shim", {}).get("telemetry") if res else None
check(f"the shim's telemetry: {tele}", tele == "cupti")
# A step with GPU times has a base; one without (before CUPTI started) has none.
bases, untimed = [], 0
for f in sorted(glob.glob(d + "/step-*.trace")):
    text = open(f).read()
    m = re.search(r"^base (\d+)$", text, re.M)
    timed = int(re.search(r"gpu_busy_ns (-?\d+)", text).group(1)) >= 0
    if timed:
        bases.append(int(m.group(1)) if m else None)
    else:
        untimed += 1
check(f"{len(bases)} timed step files, every one with a base ({untimed} untimed)", bases and all(b is not None for b in bases))
if bases and all(bases):
    check(f"bases inside the run's span ({(bases[0] - t0) / 1e9:.2f} s to {(bases[-1] - t0) / 1e9:.2f} s of {(t1 - t0) / 1e9:.2f} s)",
          t0 <= bases[0] and bases[-1] <= t1)
    gaps = [(b - a) / 1e6 for a, b in zip(bases, bases[1:])]
    check(f"bases grow step by step (ms apart: {[round(g, 1) for g in gaps]})", all(g > 0 for g in gaps))
try:
    j = json.load(open(chrome))
    ev = j["traceEvents"]
    names = [e["name"] for e in ev if e.get("ph") == "X" and e.get("tid", 0) >= 10]
    mangled = sum(1 for n in names if n.startswith("_Z"))
    check(f"trace chrome: {len(ev)} events, base {j.get('baseTimeNanoseconds')}, {mangled} of {len(names)} kernel names still mangled",
          names and j.get("baseTimeNanoseconds") == bases[0] and mangled * 100 < len(names))
except Exception as e:
    check(f"trace chrome: {e}", False)
print("trace check: " + ("all passed" if ok else "FAILED"))
PY
gzip -f "$out/steps.json" 2> /dev/null
