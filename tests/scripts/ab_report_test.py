#!/usr/bin/env python3
"""scripts/bench/ab_report.py on made-up runs: a clear difference is called one, a difference
smaller than the spread between runs of one arm is not, and a difference within the steps'
noise is not either. Exit 1 on a wrong verdict."""
import json
import os
import random
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
report = os.path.join(root, "scripts", "bench", "ab_report.py")


def runs(tmp, name, means, noise, rng):
    paths = []
    for k, m in enumerate(means):
        p = os.path.join(tmp, f"{name}{k}.json")
        with open(p, "w") as f:
            json.dump({"ms_per_step": m, "step_ms": [m + rng.gauss(0, noise) for _ in range(11)],
                       "losses_hex": ["0x1p+3"], "grad_sha256": "00"}, f)
        paths.append(p)
    return f"{name}=" + ",".join(paths)


def verdict(a_means, b_means, noise, seed):
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, report, "--a", runs(tmp, "base", a_means, noise, rng),
                              "--b", runs(tmp, "shim", b_means, noise, rng)],
                             check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


cases = [
    # (baseline runs' means, shim runs' means, per-step noise, expected words)
    ((4298.0, 4299.0), (4305.5, 4305.7), 2.0, "shim is slower than base"),  # a small, steady lead
    ((4300.0, 4301.0), (4290.0, 4291.0), 2.0, "shim is faster than base"),
    ((4175.7, 4194.3), (4198.0, 4201.1), 2.5, "not shown different"),  # one arm's runs 18.6 ms apart
    ((4300.0, 4300.0), (4300.5, 4300.0), 3.0, "not distinguishable"),
]
failed = 0
for a, b, noise, want in cases:
    got = verdict(a, b, noise, seed=1)
    ok = want in got
    failed += not ok
    print(("ok   " if ok else "FAIL ") + f"{a} vs {b}: {got}")
sys.exit(1 if failed else 0)
