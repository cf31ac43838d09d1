#!/usr/bin/env python3
"""Where a step's GPU time goes, from OFFLOAD_TRACE step traces (CUPTI times).

    gaps.py TRACE_DIR [TRACE_DIR ...]

Per step: the span from the first kernel's start to the last one's end, the busy time (the union
of kernel intervals), the idle gaps in between and the largest of them (with the launch after
it). Then, per directory, the kernels' summed GPU time by kind (GEMMs, attention, the rest)
averaged over its steps, and the kernels whose time changed most between the first directory
and each other one (by name, summed per step: the two runs may launch different sequences).
"""
import collections
import os
import statistics
import sys


def read(path):
    kernels, launches, head = {}, [], {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "step":
                head = dict(zip(w[0::2], w[1::2]))
            elif w[0] == "kernel":
                kernels[int(w[1])] = w[2] if len(w) > 2 else "?"
            elif w[0] == "launch":
                pos, kind, kid, start, ns = int(w[1]), w[2], int(w[3]), int(w[5]), int(w[6])
                if start >= 0 and ns >= 0:
                    launches.append((start, start + ns, pos, kind, kid))
    return int(head.get("step", -1)), kernels, sorted(launches)


def leads(path):
    """Per launch position, its lead (ns) where the trace has one (OFFLOAD_TRACE_LEAD=1): its GPU
    start less the moment the shim forwarded it."""
    out = {}
    with open(path) as f:
        for line in f:
            w = line.split()
            if w and w[0] == "launch" and "lead" in w[8:]:
                out[int(w[1])] = int(w[w.index("lead", 8) + 1])
    return out


def transfers(path):
    """A step's transfers (trace format 1.2: every copy the GPU ran in the step's span, the shim's
    own included): (start, end, bytes, direction) in ns from the step's first kernel start."""
    out = []
    with open(path) as f:
        for line in f:
            w = line.split()
            if w and w[0] == "transfer":
                s, ns = int(w[1]), int(w[2])
                out.append((s, s + ns, int(w[3]), w[4]))
    return sorted(out)


def union(intervals):
    """Sorted, merged [start, end) intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def overlap(s, e, merged, i=0):
    """ns of [s, e) under the merged intervals, looking from index i; and the index to look from
    for a later interval (callers walking kernels in start order)."""
    while i < len(merged) and merged[i][1] <= s:
        i += 1
    n, j = 0, i
    while j < len(merged) and merged[j][0] < e:
        n += min(e, merged[j][1]) - max(s, merged[j][0])
        j += 1
    return n, i


def kind_of(name):
    n = name.lower()
    # Attention first: flash kernels' names carry cutlass types.
    if "flash" in n or "fmha" in n or "attention" in n:
        return "attention"
    if "nvjet" in n or "gemm" in n or "cutlass" in n or "sm90_xmma" in n:
        return "gemm"
    return "other"


def step_facts(path):
    return facts_of(*read(path))


def facts_of(step, kernels, ls):
    """A step's span, busy time, idle gaps (ns, launch after, kernel) and time by kind and name."""
    if not ls:
        return None
    busy, gaps, end = 0, [], ls[0][0]
    for s, e, pos, kind, kid in ls:
        if s > end:
            gaps.append((s - end, pos, kernels.get(kid, kind)))
        if e > end:
            busy += e - max(s, end)
            end = e
    by_kind, by_name = collections.Counter(), collections.Counter()
    for s, e, pos, kind, kid in ls:
        name = kernels.get(kid, kind)
        by_kind[kind_of(name) if kind == "K" else "copy/memset"] += e - s
        by_name[name] += e - s
    return {"step": step, "span": end - ls[0][0], "busy": busy, "gaps": gaps, "by_kind": by_kind, "by_name": by_name}


def main():
    dirs = sys.argv[1:]
    if not dirs:
        sys.exit(__doc__)
    runs = []
    for d in dirs:
        files = sorted(f for f in os.listdir(d) if f.endswith(".trace"))
        steps = [x for x in (step_facts(os.path.join(d, f)) for f in files) if x]
        runs.append((d, steps))
        print(f"== {d}: {len(steps)} steps with GPU times")
        print(f"{'step':>5} {'span ms':>10} {'busy ms':>10} {'gaps ms':>8} {'gaps':>5}  largest gaps (ms @ launch)")
        for x in steps:
            g = sorted(x["gaps"], reverse=True)
            top = ", ".join(f"{ns / 1e6:.2f}@{pos}" for ns, pos, _ in g[:4])
            print(f"{x['step']:>5} {x['span'] / 1e6:>10.1f} {x['busy'] / 1e6:>10.1f} "
                  f"{sum(n for n, _, _ in g) / 1e6:>8.2f} {len(g):>5}  {top}")
    print("\nmean GPU time per step by kind (ms), steps 2 and later of each run:")
    kinds = sorted({k for _, steps in runs for x in steps for k in x["by_kind"]})
    print(f"{'run':<40} " + " ".join(f"{k:>12}" for k in kinds))
    names = []  # per run: mean GPU time a step by kernel name (ms)
    for d, steps in runs:
        use = [x for x in steps if x["step"] >= 2] or steps
        by_kind = {k: statistics.fmean(x["by_kind"][k] for x in use) / 1e6 for k in kinds}
        names.append(collections.Counter())
        for x in use:
            for n, v in x["by_name"].items():
                names[-1][n] += v / len(use) / 1e6
        print(f"{os.path.basename(d.rstrip('/')):<40} " + " ".join(f"{by_kind[k]:>12.1f}" for k in kinds))
    base = names[0]
    for (d, _), these in zip(runs[1:], names[1:]):
        diff = sorted(((these[n] - base[n], n) for n in set(these) | set(base)), key=lambda t: -abs(t[0]))
        print(f"\nlargest per-kernel changes, {os.path.basename(d.rstrip('/'))} - {os.path.basename(runs[0][0].rstrip('/'))} (ms a step):")
        for v, n in diff[:12]:
            print(f"  {v:+8.2f}  {base[n]:9.1f} -> {these[n]:9.1f}  {n[:110]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
