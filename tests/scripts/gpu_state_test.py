#!/usr/bin/env python3
"""scripts/bench/gpu_state.py on made-up samples: two idle ones (left out), three busy ones at
1980, 1755 and 1980 MHz (mean 1905, median 1980, least 1755), 600, 690 and 690 W (mean 660), 50, 61 and 58
C, the power cap active in two of the three; a cut line and an [N/A] clock skipped. Exit 1
otherwise."""
import os
import re
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
script = os.path.join(root, "scripts", "bench", "gpu_state.py")

rows = [
    "2026/11/30 16:00:00.000, 0 %, 345 MHz, 2619 MHz, 80.10 W, 35, 0x0000000000000001",
    "2026/11/30 16:00:01.000, 95 %, 1980 MHz, 2619 MHz, 600.00 W, 50, 0x0000000000000000",
    "2026/11/30 16:00:02.000, 100 %, 1755 MHz, 2619 MHz, 690.00 W, 61, 0x0000000000000004",
    "2026/11/30 16:00:03.000, 100 %, [N/A], 2619 MHz, 690.00 W, 61, 0x0000000000000004",
    "2026/11/30 16:00:04.000, 99 %, 1980 MHz, 2619 MHz, 690.00 W, 58, 0x0000000000000004",
    "2026/11/30 16:00:05.000, 3 %, 1980 MHz, 2619 MHz, 120.00 W, 45, 0x0000000000000001",
    "2026/11/30 16:00:06.000, 100 %, 19",
]
with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "lora_ab_shim_1.smi")
    with open(path, "w") as f:
        f.write("\n".join(rows) + "\n")
    out = subprocess.run([sys.executable, script, path], check=True, capture_output=True, text=True).stdout

want = (r"^lora_ab_shim_1: 3 busy samples; SM clock mean 1905\.0 MHz, median 1980 \(1755-1980\); power 660 W mean; "
        r"temperature 61 C at most; clock held down by: sw_power_cap 67%$")
if not re.search(want, out, re.M):
    print(f"gpu_state.py: no match for {want!r} in:\n{out}")
    sys.exit(1)
print(out, end="")
