#!/usr/bin/env python3
"""scripts/bench/link_use.py on a made-up traced step (times in ms below, ns in the file).

Kernels from 0 to 100 and from 150 to 300. Copies out: 10-40 and 45-60 (1 GB and 0.5 GB);
reloads: 80-130 and 130-200 (1 GB and 1 GB). So: step 300, kernels busy 250, head 10, out span
50 (busy 45, idle 5, longest gap 5), turn 20, in span 120 (busy 120), tail 100, no overlap;
out 1.5 GB in 45 ms (33.3 GB/s), in 2 GB in 120 ms (16.7 GB/s). Then a step whose reloads start
10 ms before its copies out end: turn -10, 10 ms with both directions at once. A step with reloads only is left out. Exit 1 otherwise."""
import json
import os
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
script = os.path.join(root, "scripts", "bench", "link_use.py")
MS = 1000000


def launch(pos, start, end):
    return f"launch {pos} K 1 0 {start * MS} {(end - start) * MS} 0\n"


def transfer(start, end, n, kind):
    return f"transfer {start * MS} {(end - start) * MS} {n} {kind}\n"


with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "step-000001.trace"), "w") as f:  # reloads only: left out
        f.write("offload-trace 1.2\n" + launch(0, 0, 50) + transfer(5, 10, 10**6, "h2d") + "end\n")
    with open(os.path.join(tmp, "step-000002.trace"), "w") as f:
        f.write("offload-trace 1.2\n" + launch(0, 0, 100) + launch(1, 150, 300))
        f.write(transfer(10, 40, 10**9, "d2h") + transfer(45, 60, 5 * 10**8, "d2h"))
        f.write(transfer(80, 130, 10**9, "h2d") + transfer(130, 200, 10**9, "h2d") + "end\n")
    out_json = os.path.join(tmp, "use.json")
    text = subprocess.run([sys.executable, script, tmp, "--json", out_json], check=True, capture_output=True,
                          text=True).stdout
    got = json.load(open(out_json))

steps = got["steps"]
m = got["median"]
want = {"step": 300, "kernel_busy": 250, "head": 10, "out_span": 50, "out_busy": 45, "out_idle": 5,
        "out_idle_max": 5, "turn": 20, "in_span": 120, "in_busy": 120, "in_idle": 0, "tail": 100,
        "both_busy": 0.0, "out_copies": 2, "in_copies": 2}
bad = [f"{k}: {m[k]} != {v}" for k, v in want.items() if abs(m[k] - v) > 1e-9]
if len(steps) != 1 or steps[0]["n"] != 2:
    bad.append(f"steps kept: {[s['n'] for s in steps]} (want [2])")
if abs(m["out_rate"] - 1.5e9 / 45e6) > 1e-9 or abs(m["in_rate"] - 2e9 / 120e6) > 1e-9:
    bad.append(f"rates {m['out_rate']} / {m['in_rate']} GB/s")
if "= head 10.0 + out span 50.0 + turn 20.0 + in span 120.0 + tail 100.0" not in text:
    bad.append("summary line: " + text)
# Reloads that start before the last copy out ends: a negative turn, and the overlap counted once.
with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "step-000003.trace"), "w") as f:
        f.write("offload-trace 1.2\n" + launch(0, 0, 100) + transfer(0, 50, 10**9, "d2h") + transfer(40, 100, 10**9, "h2d"))
    out_json = os.path.join(tmp, "use.json")
    subprocess.run([sys.executable, script, tmp, "--json", out_json], check=True, capture_output=True)
    m2 = json.load(open(out_json))["median"]
for k, v in {"turn": -10, "both_busy": 10, "head": 0, "tail": 0, "out_span": 50, "in_span": 60}.items():
    if abs(m2[k] - v) > 1e-9:
        bad.append(f"overlapping step, {k}: {m2[k]} != {v}")
if bad:
    print("link_use.py:\n  " + "\n  ".join(bad))
    sys.exit(1)
print("link_use.py: ok")
