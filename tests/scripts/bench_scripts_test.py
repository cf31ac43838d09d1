#!/usr/bin/env python3
"""The report scripts of scripts/bench, each on made-up input whose answer is known: one check
per script below (its docstring says what it feeds and expects). Runs them all; exit 1 if any
failed."""
import importlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(root, "scripts", "bench"))


def expect_match(failures, out, pattern, what, flags=0, show_out=False):
    """Records a failure when `pattern` is not found in a report's output `out`."""
    if not re.search(pattern, out, flags):
        failures.append(f"{what}: no match for {pattern!r}" + (f" in:\n{out}" if show_out else ""))


def finish(failures, out=None):
    """Prints the report (when given) and every failure; the check's exit status."""
    if out is not None:
        print(out)
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


def check_ab_report():
    """scripts/bench/ab_report.py on made-up runs: a clear difference is called one, a difference
    smaller than the spread between runs of one arm is not, and a difference within the steps'
    noise is not either. Exit 1 on a wrong verdict."""
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
    return 1 if failed else 0


def check_gaps_at():
    """scripts/bench/gaps_at.py on made-up step traces: 20 launches of 100 us, 2 us apart before
    the plan; under it, 18 us more before launches 5 and 12 (a window's use and a reload's issue in
    the made-up plan), 1 us more before every other, and launch 7 10 us longer. The steps under the
    plan have leads (OFFLOAD_TRACE_LEAD): launch 5 was handed over 8 us before it started (the GPU
    waited for the host), launch 12 400 us before (it sat queued), every other 1 ms before. The
    report must find exactly that. Exit 1 otherwise."""
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
        import gaps_at  # scripts/bench is on the path
        slack_13 = gaps_at.slack_of(os.path.join(tmp, "step-000002.trace"), {13})
        slack_5 = gaps_at.slack_of(os.path.join(tmp, "step-000002.trace"), {5})
        out = subprocess.run([sys.executable, script, tmp, "--before", "0,1", "--under", "2,3", "--plan", plan,
                              "--bucket", "10", "--baseline", tmp, "--baseline-steps", "0,1"],
                             check=True, capture_output=True, text=True).stdout

    failures = []
    def expect(pattern, what):
        expect_match(failures, out, pattern, what)

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
    return finish(failures, out)


def check_cache_whatif():
    """scripts/bench/cache_whatif.py on a made-up step: 1000 bytes live across it; on stream a, 100
    bytes at 0-2, 300 at 1-4, 100 at 3-5, 300 at 4-6; on stream b, 100 at 3-5. Warm, every
    allocation finds a block its stream freed (5 of 5, nothing left to the allocator, the kept
    blocks filling what the step does not use: live and kept never past the live peak, 1500). With
    250 bytes kept at most the two 300-byte frees pass the bound: 3 hits, 2 allocations and 2 frees
    left (40%). Exit 1 otherwise."""
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
        expect_match(failures, out, pattern, what)

    expect(r"5 allocations born and freed in the step, 0\.00 GiB live across it", "header")
    expect(r"bound 1 MiB: 5 of 5 allocations from kept blocks; 0 allocations and 0 frees left to the allocator \(of 10: 0%\)",
           "warm, all reused")
    expect(r"bound 0\.000238419 MiB: 3 of 5 allocations from kept blocks; 2 allocations and 2 frees left to the allocator "
           r"\(of 10: 40%\)", "the bound forwards the large frees")
    # The peaks, in bytes, from the replay itself.
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
    return finish(failures, out)


def check_gpu_state():
    """scripts/bench/gpu_state.py on made-up samples: two idle ones (left out), three busy ones at
    1980, 1755 and 1980 MHz (mean 1905, median 1980, least 1755), 600, 690 and 690 W (mean 660), 50, 61 and 58
    C, the power cap active in two of the three; a cut line and an [N/A] clock skipped. Exit 1
    otherwise."""
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
        return 1
    print(out, end="")


def check_calls_report():
    """scripts/bench/calls_report.py on made-up runs over calls. A lead of 10 ms in each of three
    calls whose machines differ by 150 ms is found (the calls' spread does not hide it); a lead on one
    call that another call reverses is not (mean -5 over calls, the interval across zero); per-run
    and per-call figures are exact. Exit 1 on
    a wrong figure or verdict."""
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
        expect_match(failures, out, pattern, what, re.M, show_out=True)


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

    status = finish(failures)
    print("calls_report.py:", "ok" if not failures else f"{len(failures)} failures")
    return status


def check_link_use():
    """scripts/bench/link_use.py on a made-up traced step (times in ms below, ns in the file).

    Kernels from 0 to 100 and from 150 to 300. Copies out: 10-40 and 45-60 (1 GB and 0.5 GB);
    reloads: 80-130 and 130-200 (1 GB and 1 GB). So: step 300, kernels busy 250, head 10, out span
    50 (busy 45, idle 5, longest gap 5), turn 20, in span 120 (busy 120), tail 100, no overlap;
    out 1.5 GB in 45 ms (33.3 GB/s), in 2 GB in 120 ms (16.7 GB/s). Then a step whose reloads start
    10 ms before its copies out end: turn -10, 10 ms with both directions at once. A step with reloads only is left out. Exit 1 otherwise."""
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
        return 1
    print("link_use.py: ok")


def check_budget_report():
    """scripts/bench/budget_report.py on made-up runs: a checkpointed model under liboffload
    (ckpt-cap0.5) is timed and compared bitwise against the checkpointed run, not against plain,
    whose losses differ here. ckpt's steady step is 100 ms and the capped run's 110 ms (the median
    of 105, 110, 120 and 110: its range 105-120): 1.10x, bitwise yes, within its budget. Its
    residency counters split its steady steps (the fourth to the seventh): 80 ms of host time in
    the manager and 40 mappings over four steps are 20.0 ms and 10 a step. Its fifth step took a
    range back, predicted and used 400 launches on, evicted with the lead at 8 and out_lag 3,
    waited for 450 ms. Its 40 prefetches used over those steps (8 late) are 10 and 2 a step.
    Exit 1 otherwise."""
    def run(name, ms, losses, budget="", peak=5 << 30):
        return name, {"workload": "w", "budget_env": budget, "step_ms": [900.0] + [ms] * 6,
                      "losses": losses, "param_hash": "h" + str(losses[0]), "peak_rise": peak, "error": None}
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        paths = []
        capped = run("ckpt-cap0.5", 110.0, [1.5, 2.5], str(3 << 30), 2 << 30)
        capped[1]["step_ms"] = [900.0, 110.0, 110.0, 105.0, 110.0, 120.0, 110.0]
        G = 1 << 30
        capped[1]["offload_at_3"] = {"busy_ns": 5_000_000, "maps": 7, "bytes_out": 0, "bytes_in": 0,
                                     "host_mapped": 10 * G, "host_pin_ns": 9_000_000_000, "prefetch_hits": 0,
                                     "prefetch_late": 0, "prefetch_hit_lead": 0, "prefetch_late_lead": 0, "prefetch_late_out": 0}
        capped[1]["offload"] = {"busy_ns": 85_000_000, "maps": 47, "bytes_out": 0, "bytes_in": 0,
                                "host_mapped": 13 * G, "host_peak_in_use": 12 * G, "host_ahead": 2 * G,
                                "host_pin_ns": 9_400_000_000, "host_ahead_ns": 800_000_000, "prefetch_hits": 40,
                                "prefetch_late": 8, "prefetch_hit_lead": 1200, "prefetch_late_lead": 40, "prefetch_late_out": 16}
        back = {"taken_back": 1, "taken_back_next": 400, "taken_back_after": 400, "taken_back_lead": 8,
                "taken_back_lag": 3, "wait_abandon_ns": 450_000_000}
        capped[1]["offload_steps"] = [{}] * 4 + [back] * 3  # the fifth step's, then none more
        for name, r in [run("plain", 80.0, [1.0, 2.0]), run("ckpt", 100.0, [1.5, 2.5]), capped]:
            paths.append(os.path.join(tmp, f"w-{name}.json"))
            json.dump(r, open(paths[-1], "w"))
        out = subprocess.run([sys.executable, os.path.join(root, "scripts", "bench", "budget_report.py"), *paths],
                             check=True, capture_output=True, text=True).stdout
    expect_match(failures, out, r"\| w \| ckpt-cap0\.5 \| 3\.00 \| 2\.00 \| yes \| 900\.0 \| 110\.0 \| 105-120 \| 1\.10 \|"
                 r"[^\n]*\| yes \|  \|", "the capped checkpointed run against ckpt", show_out=True)
    expect_match(failures, out, r"\| w \| ckpt \|[^\n]*\| 100\.0 \| 100-100 \| 1\.25 \|[^\n]*\| NO \|", "ckpt against plain")
    expect_match(failures, out, r"\| w \| ckpt-cap0\.5 \| 110\.0 \| 20\.0 \|( 0\.0 \|){15} 100\.0 \| 200\.0 \|( 0\.0 \|){4}( 0 \|){4} 10 \|",
                 "the capped run's host time and mappings a steady step")
    expect_match(failures, out, r"\| w \| ckpt-cap0\.5 \| 5 \| 1 \| 400 \| 400 \| 8 \| 3 \| 450\.0 \|",
                 "the range the fifth step took back")
    # 3 GiB more over four steady steps, 2 of them made ahead (200 ms a step), 1 where needed (100 ms a step).
    expect_match(failures, out, r"\| w \| ckpt-cap0\.5 \| 10\.00 \| 13\.00 \| 12\.00 \| 1\.00 \| 100\.0 \| 2\.00 \| 200\.0 \|",
                 "the host store over the steady steps")
    # 40 prefetches used over four steady steps, 8 late: 30 launches from prefetch to use on average,
    # 5 for the late ones, whose copies out had started 2 launches before their prefetches.
    expect_match(failures, out, r"\| w \| ckpt-cap0\.5 \| 10 \| 2 \| 30 \| 5 \| 2 \|", "the prefetches' leads")
    if re.search(r"\| w \| ckpt-cap0\.5 \| [67] \|", out):
        failures.append("only the fifth step took a range back")
    return finish(failures)


def check_recompute_bound():
    """scripts/bench/recompute_bound.py on a made-up step: a weight x lives across it; y (8 MiB) is
    made from x by a GELU kernel at launch 0 (1 ms), z (8 MiB) from x by a dropout kernel at launch
    1, w (8 MiB) by a fill that reads nothing at launch 2; all three are read at launch 4, after the
    peak (launch 3), and freed at 5. Three activations (0.02 GiB); y alone could be made again
    (0.01 GiB, its producer 1.00 ms, the link 0.16 ms one way at 53.8 GB/s). Exit 1 otherwise."""
    trace = "\n".join([
        "offload-trace 1.3",
        "step 0 launches 6 allocs 4 kernels 3 gpu_busy_ns -1 cupti_kernels -1",
        "kernel 0 void at::native::gelu_kernel", "kernel 1 void philox_dropout_kernel", "kernel 2 void fill_kernel",
        "alloc 0 8388608 0 -1 -1", "alloc 1 8388608 0 0 5", "alloc 2 8388608 0 1 5", "alloc 3 8388608 0 2 5",
        "launch 0 K 0 0 0 1000000 2 1 0", "launch 1 K 1 0 0 1000 2 2 0", "launch 2 K 2 0 0 1000 1 3",
        "launch 3 K 2 0 0 1000 1 0", "launch 4 K 2 0 0 1000 3 1 2 3", "launch 5 K 2 0 0 1000 1 0", "end", ""])
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "made.trace")
        open(path, "w").write(trace)
        out = subprocess.run([sys.executable, os.path.join(root, "scripts", "bench", "recompute_bound.py"), path],
                             check=True, capture_output=True, text=True).stdout
    expect_match(failures, out, r"\| made\.trace \| 3, 0\.02 \| 1, 0\.01 \| 1\.00 \| 0\.16 \|", "the GELU's output alone",
                 show_out=True)
    return finish(failures)


def check_policy_replay():
    """scripts/bench/policy_replay.py against a made-up offloadctl: its steps 0-3 each map 100 times
    and the later ones 10 (20 with OFFLOAD_CAP_KEEP_ASKED=0), 2 handles made, 1 demand reload, 3 waits
    and 1 GiB out a step;
    the run with OFFLOAD_CAP_TILE=exact misses the budget. From step 3 on, the defaults' cell is
    (100 + 10 * 6) / 7 = 23 mappings, the other arm's (100 + 20 * 6) / 7 = 31, the failed one says
    FAIL, and an OFFLOAD_CAP_ setting of the caller's own environment reaches no arm. Exit 1
    otherwise."""
    fake = "\n".join([
        "#!/usr/bin/env python3",
        "import json, os",
        "later = 20 if os.environ.get('OFFLOAD_CAP_KEEP_ASKED') == '0' else 10",
        "assert 'OFFLOAD_CAP_PIECE' not in os.environ",
        "steps = [dict(maps=100 if i < 4 else later, created=2, reloads=1, waits=3, bytes_out=1 << 30) for i in range(10)]",
        "ok = os.environ.get('OFFLOAD_CAP_TILE') != 'exact'",
        "print(json.dumps(dict(cap=dict(per_step=steps, within_budget=ok, mismatches=0))))", ""])
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "offloadctl")
        open(path, "w").write(fake)
        os.chmod(path, 0o755)
        env = dict(os.environ, OFFLOAD_CAP_PIECE="1MiB")
        out = subprocess.run([sys.executable, os.path.join(root, "scripts", "bench", "policy_replay.py"), path,
                              "--caps", "0.5", "now:", "smallest:OFFLOAD_CAP_KEEP_ASKED=0", "exact:OFFLOAD_CAP_TILE=exact",
                              "--", "one.trace"], check=True, capture_output=True, text=True, env=env).stdout
    expect_match(failures, out, r"\| one \| 0\.5 \| 23 / 2 / 1 / 3, 1\.00 \| 31 / 2 / 1 / 3, 1\.00 \| FAIL \|",
                 "the steady means, the arms' settings and the failed run", show_out=True)
    return finish(failures)


def check_planner_report():
    """scripts/bench/planner_report.py's lower bound on made-up counters.

    Plain 200 ms a step, the planner's forward : backward 1 : 3 (50 and 150 ms). Under the plan, 10
    steps moved 11 GB out and 10 GB in (1.1 and 1.0 GB a step: an arena asked back before its copy
    out ended stayed). At 50 GB/s each way: forward max(50, 22) = 50, backward max(150, 20) = 150,
    bound 200 ms; at 5 GB/s: max(50, 220) + max(150, 200) = 420 ms, not the 440 that the planner's
    1.1 GB both ways would give. Without the executor's counters, the planner's bytes_moved counts
    both ways. At 20 GB/s: max(50, 55) + max(150, 50) = 205 ms. A run whose shim planned again after its timed steps (run.py's timed_plan: the plan they
    ran) is bounded and predicted from the plan they ran, not from the one at the end (whose split,
    300 : 25, would give 234.6 ms). Exit 1
    otherwise."""
    import planner_report  # noqa: E402

    plain = {"ms_per_step": 200.0}
    planner = {"forward_ns": 1_000_000, "backward_ns": 3_000_000, "bytes_moved": 1_100_000_000}
    run = {"shim": {"executor": {"steps_active": 10, "bytes_out": 11_000_000_000, "bytes_in": 10_000_000_000,
                                 "planner": planner}}}
    bare = {"shim": {"executor": {"planner": planner}}}
    after = {"forward_ns": 300_000_000, "backward_ns": 25_000_000, "predicted_step_ns": 370_000_000}
    replanned = {"shim": {"executor": {"steps_active": 10, "bytes_out": 11_000_000_000, "bytes_in": 10_000_000_000,
                                       "planner": after}},
                 "timed_plan": {"planner": dict(planner, predicted_step_ns=353_000_000)}}
    bad = []
    for got, want, what in [
        (planner_report.moved_per_step(run), (1.1e9, 1.0e9), "bytes out / in per step"),
        (planner_report.lower_bound_ms(plain, run, 50.0, 50.0), 200.0, "bound at 50 GB/s"),
        (planner_report.lower_bound_ms(plain, run, 5.0, 5.0), 420.0, "bound at 5 GB/s"),
        (planner_report.moved_per_step(bare), (1.1e9, 1.1e9), "bytes without the executor's counters"),
        (planner_report.lower_bound_ms(plain, bare, 5.0, 5.0), 440.0, "bound without the executor's counters"),
        (planner_report.lower_bound_ms({}, run, 5.0, 5.0), None, "bound without plain"),
        (planner_report.lower_bound_ms(plain, replanned, 20.0, 20.0), 205.0, "bound from the plan the timed steps ran"),
        (planner_report.planner(replanned).get("predicted_step_ns"), 353_000_000, "prediction of the plan the timed steps ran"),
    ]:
        ok = got == want if not isinstance(want, float) else got is not None and abs(got - want) < 1e-9
        if isinstance(want, tuple):
            ok = all(abs(a - b) < 1e-3 for a, b in zip(got, want))
        if not ok:
            bad.append(f"{what}: {got} (want {want})")
    if bad:
        print("planner_report.py:\n  " + "\n  ".join(bad))
        return 1
    print("planner_report.py: ok")


failed = []
for name, check in [(n, f) for n, f in globals().items() if n.startswith("check_")]:
    status = check()
    print(f"{name[6:]}: {'FAILED' if status else 'ok'}", file=sys.stderr if status else sys.stdout, flush=True)
    if status:
        failed.append(name[6:])
sys.exit(1 if failed else 0)
