#!/usr/bin/env python3
"""scripts/bench/cache_whatif.py on a made-up step: 1000 bytes live across it; on stream a, 100
bytes at 0-2, 300 at 1-4, 100 at 3-5, 300 at 4-6; on stream b, 100 at 3-5. Warm, every
allocation finds a block its stream freed (5 of 5, nothing left to the allocator, the kept
blocks filling what the step does not use: live and kept never past the live peak, 1500). With
250 bytes kept at most the two 300-byte frees pass the bound: 3 hits, 2 allocations and 2 frees
left (40%). Exit 1 otherwise."""
import os
import re
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
script = os.path.join(root, "scripts", "bench", "cache_whatif.py")

with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "step-000000.trace")
    with open(path, "w") as f:
        f.write("offload-trace 1.2\nstep 0 launches 6 allocs 6 kernels 0 gpu_busy_ns -1 cupti_kernels -1\n")
        for o, b, s, a, fr in ((0, 1000, "a", -1, -1), (1, 100, "a", 0, 2), (2, 100, "a", 3, 5), (3, 100, "b", 3, 5),
                               (4, 300, "a", 1, 4), (5, 300, "a", 4, 6)):
            f.write(f"alloc {o} {b} {s} {a} {fr}\n")
        f.write("end\n")
    mib = 2**20
    out = subprocess.run([sys.executable, script, path, "--bound", str(1), str(250 / mib)],
                         check=True, capture_output=True, text=True).stdout

failures = []
def expect(pattern, what):
    if not re.search(pattern, out):
        failures.append(f"{what}: no match for {pattern!r}")

expect(r"5 allocations born and freed in the step, 0\.00 GiB live across it", "header")
expect(r"bound 1 MiB: 5 of 5 allocations from kept blocks; 0 allocations and 0 frees left to the allocator \(of 10: 0%\)",
       "warm, all reused")
expect(r"bound 0\.000238419 MiB: 3 of 5 allocations from kept blocks; 2 allocations and 2 frees left to the allocator "
       r"\(of 10: 40%\)", "the bound forwards the large frees")
# The peaks, in bytes, from the replay itself.
sys.path.insert(0, os.path.dirname(script))
import cache_whatif  # noqa: E402
inside = [(1, 100, "a", 0, 2), (2, 100, "a", 3, 5), (3, 100, "b", 3, 5), (4, 300, "a", 1, 4), (5, 300, "a", 4, 6)]
warm = cache_whatif.replay(inside, 1000, 1 << 20, 3)
if (warm["kept_peak"], warm["peak_live"], warm["peak_both"]) != (500, 1500, 1500):
    failures.append(f"warm peaks {warm}: want kept 500, live 1500, live and kept 1500")
cold = cache_whatif.replay(inside, 1000, 1 << 20, 1)
if (cold["hits"], cold["misses"]) != (2, 3):
    failures.append(f"the first step {cold}: want 2 hits (the second 100 and 300 on a), 3 misses")
small = cache_whatif.replay(inside, 1000, 1 << 20, 3, max_block=100)
if (small["hits"], small["forwarded"]) != (3, 2):
    failures.append(f"blocks of at most 100 bytes {small}: want 3 hits, 2 frees forwarded")
print(out)
for f in failures:
    print("FAIL", f)
sys.exit(1 if failures else 0)
