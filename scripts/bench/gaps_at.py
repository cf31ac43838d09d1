#!/usr/bin/env python3
"""Where a plan's extra idle time sits, launch by launch (OFFLOAD_TRACE step files, CUPTI times).

    gaps_at.py TRACE_DIR --before 2,3 --under 7,8,9,10 [--plan FILE]
               [--baseline DIR --baseline-steps 2,3,4]

The idle gap before each launch (its start minus the latest end of every launch before it) and
each launch's GPU time, averaged over the steps before the plan and over the steps under it;
then, per 500 launches, how much more idle and kernel time there is under the plan; the
positions whose gap grew most; and how the growth splits by size (under 5 µs, 5-50 µs,
more). With --plan (a weight plan as `offloadctl plan` writes it, such as
tests/data/plans/lora-20GiB-weights.plan), which of the 5-50 µs positions are a window's use or
reload: the launch first reading a reloaded weight, or the one its reload is issued at; and how
much the uses' idle gap and GPU time grew each, against the other launches by kind (GEMMs,
attention, the rest).

With --baseline (another run's traces with the same kernels in the same order, such as the
hand-written baseline observed by the shim), the steps under the plan against that run's, kernel
by kernel (the k-th kernel of a step against the k-th): how much more gap and GPU time each
kernel has: the plan's uses (with --plan), then the other kernels by kind.

Traces with transfers (format 1.2: the copies the GPU ran, the shim's reloads among them) also
get the link's side, for the steps under the plan and the baseline's: per step the copies each
way, their bytes, the link's busy time and rate; the share of each kind of kernel's time that
ran beside a host-to-device copy; with --plan, how long before each use the last copy before it
had ended (a reload landed at the latest then); and, for the kernels that ran both ways often
enough, how much longer a kernel runs beside a copy (90% of its time or more) than clear of one
(10% or less).

Traces with leads (OFFLOAD_TRACE_LEAD=1) also sort the gaps of 5 µs or more by the lead of the
launch after them: under --host-bound (30 µs), the host handed the launch over only as the GPU
went idle, so the GPU waited for the host; otherwise the launch sat queued behind something
else (an event wait on another stream, another stream's work).
"""
import argparse
import bisect
import os

import gaps  # the trace reader and the gap definition (scripts/bench/gaps.py)


def idle_of(path):
    """A step's kernel names, its timed launches (gaps.read) and, per launch position, the idle
    gap before it (ns), as gaps.py counts it."""
    step, kernels, ls = gaps.read(path)
    facts = gaps.facts_of(step, kernels, ls) or {"gaps": []}
    idle = {}
    for ns, pos, _ in facts["gaps"]:
        idle[pos] = idle.get(pos, 0) + ns
    return kernels, ls, idle


def read(path):
    """Per launch position: the idle gap before it and its GPU time (ns)."""
    _, ls, idle = idle_of(path)
    dur = {}
    for s, e, pos, _, _ in ls:
        dur[pos] = dur.get(pos, 0) + (e - s)
    return idle, dur


def by_lead(path, bound_ns):
    """A step's gaps of 5 us or more, by the lead of the launch after them: (host-bound count, ns),
    (queued count, ns), (no lead count, ns), and the leads of all its launches."""
    _, _, idle = idle_of(path)
    lead = gaps.leads(path)
    out = {"host": [0, 0], "queued": [0, 0], "none": [0, 0]}
    for pos, ns in idle.items():
        if ns < 5000:
            continue
        k = "none" if pos not in lead else "host" if lead[pos] < bound_ns else "queued"
        out[k][0] += 1
        out[k][1] += ns
    return out, sorted(lead.values())


def lead_report(trace_dir, label, which, bound_ns):
    rows = [by_lead(os.path.join(trace_dir, f"step-{int(i):06d}.trace"), bound_ns) for i in which.split(",")]
    if not any(r[1] for r in rows):
        return
    n = len(rows)
    parts = []
    for k, name in (("host", "host-bound"), ("queued", "queued"), ("none", "no lead")):
        c = sum(r[0][k][0] for r in rows) / n
        ms = sum(r[0][k][1] for r in rows) / n / 1e6
        parts.append(f"{name} {c:.0f} ({ms:.2f} ms)")
    all_leads = sorted(x for r in rows for x in r[1])
    q = lambda p: all_leads[min(len(all_leads) - 1, int(p * len(all_leads)))] / 1e3
    print(f"{label}: gaps of 5 us or more a step, by the lead of the launch after them (host-bound under "
          f"{bound_ns / 1e3:.0f} us): " + ", ".join(parts) +
          f"; leads of all launches: min {all_leads[0] / 1e3:.1f}, 1% {q(0.01):.1f}, median {q(0.5):.0f} us")


def mean(maps):
    keys = set().union(*maps)
    return {k: sum(m.get(k, 0) for m in maps) / len(maps) for k in keys}


def kernel_rows(path):
    """A step's kernels in launch order: (position, name, idle gap before it, GPU time), in ns."""
    kernels, ls, idle = idle_of(path)
    return [(pos, kernels.get(kid, "?"), idle.get(pos, 0), e - s)
            for s, e, pos, kind, kid in sorted(ls, key=lambda x: x[2]) if kind == "K"]


def kernel_means(trace_dir, which):
    """kernel_rows averaged over the steps `which` (positions and names from the first)."""
    rows = [kernel_rows(os.path.join(trace_dir, f"step-{int(i):06d}.trace")) for i in which.split(",")]
    n = min(len(r) for r in rows)
    return [(rows[0][k][0], rows[0][k][1], sum(r[k][2] for r in rows) / len(rows), sum(r[k][3] for r in rows) / len(rows))
            for k in range(n)]


GROUPS = ("the plan's uses", "other GEMMs", "attention", "the rest")


def group_of(pos, name, uses):
    """A kernel's group in the reports: one of the plan's uses, else by kind (gaps.kind_of)."""
    if pos in uses:
        return GROUPS[0]
    return {"gemm": GROUPS[1], "attention": GROUPS[2]}.get(gaps.kind_of(name), GROUPS[3])


def against_baseline(trace_dir, under, base_dir, base_steps, uses):
    ours, theirs = kernel_means(trace_dir, under), kernel_means(base_dir, base_steps)
    n = min(len(ours), len(theirs))
    differ = sum(1 for k in range(n) if ours[k][1] != theirs[k][1])
    print(f"against {base_dir} (steps {base_steps}), kernel by kernel: {n} kernels, {differ} with another name")
    if differ or len(ours) != len(theirs):
        print("  the kernel sequences differ: no comparison")
        return
    for label in GROUPS:
        ks = [k for k in range(n) if group_of(ours[k][0], ours[k][1], uses) == label]
        if not ks:
            continue
        dg = sum(ours[k][2] - theirs[k][2] for k in ks)
        dk = sum(ours[k][3] - theirs[k][3] for k in ks)
        print(f"  {label}: {len(ks)} kernels, {(dg + dk) / len(ks) / 1e3:+.2f} us each ({(dg + dk) / 1e6:+.2f} ms: "
              f"gap {dg / 1e6:+.2f}, GPU time {dk / 1e6:+.2f})")


def slack_in(ls, xs, uses):
    """Per use among a step's launches `ls` (gaps.read): its start less the end of the last
    host-to-device copy of `xs` (gaps.transfers) that ended before it (ns): how long before its
    first reader a reload had landed, at the latest."""
    ends = sorted(x[1] for x in xs if x[3] == "h2d")
    out = []
    for s, _, pos, _, _ in ls:
        if pos in uses:
            i = bisect.bisect_right(ends, s)
            if i:
                out.append(s - ends[i - 1])
    return out


def slack_of(path, uses):
    """slack_in of one step file."""
    return slack_in(gaps.read(path)[2], gaps.transfers(path), uses)


def link_of(path, uses):
    """A step's transfers by direction (count, bytes, busy ns, summed copy ns); per kernel:
    (group, name, GPU ns, ns beside a host-to-device copy); and the uses' slack_in."""
    _, kernels, ls = gaps.read(path)
    xs = gaps.transfers(path)
    by_dir = {}
    for d in sorted({x[3] for x in xs}):
        mine = [x for x in xs if x[3] == d]
        busy = sum(e - s for s, e in gaps.union((x[0], x[1]) for x in mine))
        by_dir[d] = (len(mine), sum(x[2] for x in mine), busy, sum(x[1] - x[0] for x in mine))
    h2d = gaps.union((x[0], x[1]) for x in xs if x[3] == "h2d")
    rows, i = [], 0
    for s, e, pos, kind, kid in ls:  # in start order
        if kind != "K":
            continue
        name = kernels.get(kid, "?")
        n, i = gaps.overlap(s, e, h2d, i)
        rows.append((group_of(pos, name, uses), name, e - s, n))
    return by_dir, rows, slack_in(ls, xs, uses)


def link_report(trace_dir, which, label, uses):
    steps = [link_of(os.path.join(trace_dir, f"step-{int(i):06d}.trace"), uses) for i in which.split(",")]
    if not any(d for d, _, _ in steps):
        return
    n = len(steps)
    print(f"{label}: the link, a step (mean of {n}):")
    for d in sorted({k for x, _, _ in steps for k in x}):
        c, b, busy, summed = (sum(x.get(d, (0, 0, 0, 0))[k] for x, _, _ in steps) / n for k in range(4))
        rate = b / summed if summed else 0
        print(f"  {d}: {c:.0f} copies, {b / 2**30:.2f} GiB, link busy {busy / 1e6:.1f} ms, {rate:.1f} GB/s a copy")
    rows = [r for _, rs, _ in steps for r in rs]
    for group in GROUPS:
        g = [r for r in rows if r[0] == group]
        if g:
            print(f"  {group}: {len(g) / n:.0f} kernels a step, {sum(r[3] for r in g) / max(1, sum(r[2] for r in g)):.1%} "
                  f"of their time beside a host-to-device copy")
    sl = sorted(x for _, _, slack in steps for x in slack)
    if sl:
        early = sum(1 for x in sl if x >= 1_000_000)
        print(f"  the last copy before each use ended {sl[0] / 1e3:.1f} us before it at the least, "
              f"{sl[len(sl) // 2] / 1e3:.0f} us at the median; {early} of {len(sl)} 1 ms or more before")
    # The same kernel beside a copy and clear of one: how much longer it runs.
    by_name = {}
    for _, name, ns, under in rows:
        by_name.setdefault(name, []).append((ns, under / ns if ns else 0))
    found = []
    for name, xs in by_name.items():
        over = [ns for ns, f in xs if f >= 0.9]
        clear = [ns for ns, f in xs if f <= 0.1]
        if len(over) >= 10 and len(clear) >= 10:
            mo, mc = sum(over) / len(over), sum(clear) / len(clear)
            found.append((sum(ns for ns, _ in xs), name, len(over), len(clear), mo, mc))
    for total, name, no, nc, mo, mc in sorted(found, reverse=True)[:8]:
        print(f"  beside a copy / clear: {no} / {nc} runs, {mo / 1e3:.1f} / {mc / 1e3:.1f} us, "
              f"{(mo - mc) / 1e3:+.2f} us ({(mo - mc) / mc:+.2%}): {name[:60]}")


def kinds(path):
    """Per launch position with a GPU time: gemm, attention or other (gaps.kind_of)."""
    _, kernels, ls = gaps.read(path)
    return {pos: gaps.kind_of(kernels.get(kid, kind)) if kind == "K" else "copy/memset" for _, _, pos, kind, kid in ls}


def steps(trace_dir, which):
    out = [read(os.path.join(trace_dir, f"step-{int(i):06d}.trace")) for i in which.split(",")]
    return mean([g for g, _ in out]), mean([d for _, d in out])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace_dir")
    ap.add_argument("--before", required=True, help="steps before the plan, e.g. 2,3")
    ap.add_argument("--under", required=True, help="steps under the plan, e.g. 7,8,9,10")
    ap.add_argument("--plan", help="a weight plan file: windows' use and reload_at positions")
    ap.add_argument("--bucket", type=int, default=500)
    ap.add_argument("--baseline", help="another run's trace directory, the same kernels in the same order")
    ap.add_argument("--baseline-steps", help="its steps to average, e.g. 2,3,4")
    ap.add_argument("--host-bound", type=float, default=30.0, help="us: a lead under this is the GPU waiting for the host")
    args = ap.parse_args()
    g0, k0 = steps(args.trace_dir, args.before)
    g1, k1 = steps(args.trace_dir, args.under)
    n = max(max(g0, default=0), max(g1, default=0), max(k0, default=0), max(k1, default=0)) + 1
    print(f"{'launches':>11}  {'gaps before':>11} {'under':>9} {'more':>8}   {'kernels before':>14} {'under':>9} {'more':>8}  (ms)")
    for b in range(0, n, args.bucket):
        def total(m):
            return sum(v for k, v in m.items() if b <= k < b + args.bucket) / 1e6
        a, c, x, y = total(g0), total(g1), total(k0), total(k1)
        print(f"{b:5d}-{b + args.bucket - 1:<5d}  {a:11.2f} {c:9.2f} {c - a:+8.2f}   {x:14.2f} {y:9.2f} {y - x:+8.2f}")
    print(f"all: gaps {sum(g0.values()) / 1e6:.2f} -> {sum(g1.values()) / 1e6:.2f} ms, "
          f"kernels {sum(k0.values()) / 1e6:.2f} -> {sum(k1.values()) / 1e6:.2f} ms")
    d = [g1.get(k, 0) - g0.get(k, 0) for k in range(n)]
    top = sorted(range(n), key=lambda k: -d[k])[:12]
    print("largest gap increases (us @ launch):", ", ".join(f"{d[k] / 1e3:.1f}@{k}" for k in top))
    small = sum(x for x in d if 0 < x < 5000) / 1e6
    mid_pos = [k for k in range(n) if 5000 <= d[k] < 50000]
    mid = sum(d[k] for k in mid_pos) / 1e6
    big = sum(x for x in d if x >= 50000) / 1e6
    less = sum(x for x in d if x < 0) / 1e6
    print(f"growth: {small:.2f} ms at positions up under 5 us, {mid:.2f} ms at {len(mid_pos)} positions up 5-50 us, "
          f"{big:.2f} ms at positions up more; {less:.2f} ms at positions down")
    uses, reloads = set(), set()
    if args.plan:
        with open(args.plan) as f:
            for line in f:
                if line.startswith("window"):
                    kv = dict(x.split("=") for x in line.split()[1:])
                    uses.add(int(kv["use"]))
                    reloads.add(int(kv["reload_at"]))
        for name, where in (("a window's use", uses), ("a reload's issue", reloads)):
            hit = [k for k in mid_pos if k in where]
            print(f"  of the 5-50 us positions, {len(hit)} are {name} ({len(where)} in the plan): "
                  f"{sum(d[k] for k in hit) / 1e6:.2f} ms")
        either = [k for k in mid_pos if k in uses or k in reloads]
        print(f"  either: {len(either)}, {sum(d[k] for k in either) / 1e6:.2f} ms")
        # Each use, and every other launch by kind: how much its gap and its GPU time grew.
        kind = kinds(os.path.join(args.trace_dir, f"step-{int(args.under.split(',')[0]):06d}.trace"))
        groups = {}
        for k in range(n):
            if k not in kind:
                continue
            groups.setdefault("uses" if k in uses else kind[k], []).append(k)
        for name in ("uses", "gemm", "attention", "other"):
            ks = groups.get(name, [])
            if not ks:
                continue
            dg = [g1.get(k, 0) - g0.get(k, 0) for k in ks]
            dk = [k1.get(k, 0) - k0.get(k, 0) for k in ks]
            print(f"  {name if name == 'uses' else 'other ' + name + 's' if name != 'other' else 'the rest'}: "
                  f"{len(ks)} launches, gap {sum(dg) / len(ks) / 1e3:+.2f} us each ({sum(dg) / 1e6:+.2f} ms), "
                  f"GPU time {sum(dk) / len(ks) / 1e3:+.2f} us each ({sum(dk) / 1e6:+.2f} ms)")
    if args.baseline:
        against_baseline(args.trace_dir, args.under, args.baseline, args.baseline_steps or args.before, uses)
    link_report(args.trace_dir, args.under, "under", uses)
    if args.baseline:
        # The baseline's kernels at the uses' places (the k-th kernel against the k-th).
        ours = [r[0] for r in kernel_rows(os.path.join(args.trace_dir, f"step-{int(args.under.split(',')[0]):06d}.trace"))]
        theirs = [r[0] for r in kernel_rows(os.path.join(args.baseline, f"step-{int((args.baseline_steps or args.before).split(',')[0]):06d}.trace"))]
        at_uses = {theirs[k] for k in range(min(len(ours), len(theirs))) if ours[k] in uses}
        link_report(args.baseline, args.baseline_steps or args.before, "baseline (at the uses: the kernels in their places)", at_uses)
    bound = args.host_bound * 1000
    lead_report(args.trace_dir, "before", args.before, bound)
    lead_report(args.trace_dir, "under", args.under, bound)


if __name__ == "__main__":
    main()
