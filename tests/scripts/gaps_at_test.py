#!/usr/bin/env python3
"""scripts/bench/gaps_at.py on made-up step traces: 20 launches of 100 us, 2 us apart before
the plan; under it, 18 us more before launches 5 and 12 (a window's use and a reload's issue in
the made-up plan), 1 us more before every other, and launch 7 10 us longer. The steps under the
plan have leads (OFFLOAD_TRACE_LEAD): launch 5 was handed over 8 us before it started (the GPU
waited for the host), launch 12 400 us before (it sat queued), every other 1 ms before. The
report must find exactly that. Exit 1 otherwise."""
import os
import re
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
script = os.path.join(root, "scripts", "bench", "gaps_at.py")


def step(path, extra_gap, extra_dur, lead=None, beside=()):
    """`beside`: launches with a host-to-device copy of 100 kB running exactly as long as they do."""
    t = 0
    with open(path, "w") as f:
        f.write("offload-trace 1.2\nstep 0 launches 20\n")
        copies = []
        for pos in range(20):
            if pos:
                t += 2000 + extra_gap.get(pos, 0)
            ns = 100000 + extra_dur.get(pos, 0)
            tail = f" 0 lead {lead.get(pos, 1000000)}" if lead is not None else ""
            f.write(f"launch {pos} K 0 x {t} {ns}{tail}\n")
            if pos in beside:
                copies.append(f"transfer {t} {ns} 100000 h2d\n")
            t += ns
        f.writelines(copies)


with tempfile.TemporaryDirectory() as tmp:
    for i in (0, 1):
        step(os.path.join(tmp, f"step-{i:06d}.trace"), {}, {})
    more = {pos: 1000 for pos in range(1, 20)}
    more.update({5: 18000, 12: 18000})
    for i in (2, 3):
        step(os.path.join(tmp, f"step-{i:06d}.trace"), more, {7: 10000}, {5: 8000, 12: 400000}, range(7, 13))
    plan = os.path.join(tmp, "x.plan")
    with open(plan, "w") as f:
        f.write("plan budget=1\nwindow weight=0 evict_after=2 reload_at=12 use=5\n")
    # How long before a use the last copy before it ended: launch 13 starts 3 us after launch
    # 12 and its copy end; nothing is copied before launch 5.
    sys.path.insert(0, os.path.dirname(script))
    import gaps_at  # noqa: E402
    slack_13 = gaps_at.slack_of(os.path.join(tmp, "step-000002.trace"), {13})
    slack_5 = gaps_at.slack_of(os.path.join(tmp, "step-000002.trace"), {5})
    out = subprocess.run([sys.executable, script, tmp, "--before", "0,1", "--under", "2,3", "--plan", plan,
                          "--bucket", "10", "--baseline", tmp, "--baseline-steps", "0,1"],
                         check=True, capture_output=True, text=True).stdout

failures = []
def expect(pattern, what):
    if not re.search(pattern, out):
        failures.append(f"{what}: no match for {pattern!r}")

# 17 launches 1 us later (0.017 ms), two 18 us later (0.036 ms): 0.038 -> 0.091 ms of gaps.
expect(r"all: gaps 0\.04 -> 0\.09 ms, kernels 2\.00 -> 2\.01 ms", "totals")
expect(r"growth: 0\.02 ms at positions up under 5 us, 0\.04 ms at 2 positions up 5-50 us", "split by size")
expect(r"largest gap increases \(us @ launch\): 18\.0@(5|12), 18\.0@(5|12)", "largest")
expect(r"1 are a window's use \(1 in the plan\)", "use")
expect(r"1 are a reload's issue \(1 in the plan\)", "reload")
expect(r"under: gaps of 5 us or more a step, by the lead of the launch after them \(host-bound under 30 us\): "
       r"host-bound 1 \(0\.02 ms\), queued 1 \(0\.02 ms\), no lead 0 \(0\.00 ms\); "
       r"leads of all launches: min 8\.0, 1% 8\.0, median 1000 us", "by lead")
# Per use and by kind: the use (launch 5) 18 us more gap; the other 19 launches 35 us more gap
# (1 us at 17 of them, 18 at launch 12) and 10 us more GPU time (launch 7).
expect(r"uses: 1 launches, gap \+18\.00 us each \(\+0\.02 ms\), GPU time \+0\.00 us each", "the use")
expect(r"the rest: 19 launches, gap \+1\.84 us each .*GPU time \+0\.53 us each", "the rest by kind")
# Against the steps before the plan as the baseline, kernel by kernel: the same figures.
expect(r"kernel by kernel: 20 kernels, 0 with another name", "aligned")
expect(r"the plan's uses: 1 kernels, \+18\.00 us each \(\+0\.02 ms: gap \+0\.02, GPU time \+0\.00\)", "use vs baseline")
expect(r"the rest: 19 kernels, \+2\.37 us each \(\+0\.04 ms: gap \+0\.0[34], GPU time \+0\.01\)", "rest vs baseline")
# The link under the plan: six copies a step beside launches 7-12 (launch 7's 110 us long), so
# 610 us of the 19 other kernels' 1910 us; beside a copy 101.67 us a kernel, clear 100.
expect(r"under: the link, a step \(mean of 2\):\n  h2d: 6 copies, 0\.00 GiB, link busy 0\.6 ms, 1\.0 GB/s a copy", "link")
expect(r"  the plan's uses: 1 kernels a step, 0\.0% of their time beside", "uses beside")
expect(r"  the rest: 19 kernels a step, 31\.9% of their time beside", "rest beside")
expect(r"beside a copy / clear: 12 / 28 runs, 101\.7 / 100\.0 us, \+1\.67 us \(\+1\.67%\)", "beside vs clear")
if slack_13 != [3000] or slack_5 != []:
    failures.append(f"slack_of: {slack_13} and {slack_5}, want [3000] and []")
if re.search(r"^baseline", out, re.M):
    failures.append("the baseline steps have no transfers: no link lines for them")
if re.search(r"^before:", out, re.M):
    failures.append("the steps before the plan have no leads: no line for them")
print(out)
for f in failures:
    print("FAIL", f)
sys.exit(1 if failures else 0)
