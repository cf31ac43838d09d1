#!/usr/bin/env python3
"""scripts/bench/calls_report.py on made-up runs over calls. A lead of 10 ms in each of three
calls whose machines differ by 150 ms is found (the calls' spread does not hide it); a lead on one
call that another call reverses is not (mean -5 over calls, the interval across zero); per-run
and per-call figures are exact. Exit 1 on
a wrong figure or verdict."""
import json
import os
import re
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
script = os.path.join(root, "scripts", "bench", "calls_report.py")


def write(tmp, name, steps):
    p = os.path.join(tmp, name + ".json")
    with open(p, "w") as f:
        json.dump({"step_ms": steps, "ms_per_step": sum(steps) / len(steps)}, f)
    return p


def report(tmp, calls):
    """calls: [(name, [A runs' step lists], [B runs' step lists])]"""
    args = [sys.executable, script, "--arms", "base,shim"]
    for name, ra, rb in calls:
        fa = ",".join(write(tmp, f"{name}_a{k}", s) for k, s in enumerate(ra))
        fb = ",".join(write(tmp, f"{name}_b{k}", s) for k, s in enumerate(rb))
        args += ["--call", name, f"base={fa}", f"shim={fb}"]
    return subprocess.run(args, check=True, capture_output=True, text=True).stdout


failures = []
def expect(out, pattern, what):
    if not re.search(pattern, out, re.M):
        failures.append(f"{what}: no match for {pattern!r} in:\n{out}")


with tempfile.TemporaryDirectory() as tmp:
    # Three machines 150 ms apart, the shim 10 ms ahead on each (runs off by +-1 ms).
    held = report(tmp, [("c1", [[4100, 4102], [4101, 4101]], [[4090, 4092], [4090, 4090]]),
                        ("c2", [[4250, 4250]], [[4239, 4239], [4241, 4241]]),
                        ("c3", [[4400, 4400], [4402, 4402]], [[4391, 4391]])])
    expect(held, r"^\| c1 \| 4101\.0, 4101\.0 \| 4091\.0, 4090\.0 \| -10\.0, -11\.0 \| -10\.5 \|$", "c1's row")
    expect(held, r"^\| c3 \| 4400\.0, 4402\.0 \| 4391\.0 \| -10\.0 \| -10\.0 \|$", "c3's row")
    expect(held, r"^shim - base over calls: -10\.2 ms a step \(95% -10\.9 to -9\.4\), 3 calls: shim is faster than base\.$",
           "a lead on every call")
    # Ahead by 20 on one call, behind by 10 on the other.
    split = report(tmp, [("c1", [[4100, 4100.5], [4100, 4099.5]], [[4080, 4080.5], [4080, 4079.5]]),
                         ("c2", [[4250, 4250]], [[4260, 4260]])])
    expect(split, r"^shim - base over calls: -5\.0 ms a step \(95% -195\.7 to \+185\.7\), 2 calls: "
                  r"shim is not shown different from base\.$", "a lead one call reverses")
    one = report(tmp, [("c1", [[4100, 4100]], [[4090, 4090]])])
    expect(one, r"^shim - base over calls: -10\.0 ms a step, 1 call: one value: no interval\.$", "one call")

for f in failures:
    print("FAIL", f)
print("calls_report.py:", "ok" if not failures else f"{len(failures)} failures")
sys.exit(1 if failures else 0)
