#!/usr/bin/env python3
"""How an offloaded step used the link, from OFFLOAD_TRACE step files (CUPTI times, trace 1.2).

    link_use.py TRACE_DIR [--from STEP] [--link LINK_JSON] [--json OUT]

A step is link-bound when its copies out fill the forward and its reloads fill the backward.
Then its time splits into

    head        step start -> first copy out (the forward's compute before anything can leave)
    out span    first copy out's start -> last copy out's end
    turn        last copy out's end -> first reload's start (negative: they overlap)
    in span     first reload's start -> last reload's end
    tail        last reload's end -> the step's last kernel end (compute after the last reload)

and each span into the link's busy time (the union of that direction's copies) and its idle time
(gaps between them). Busy time against bytes gives the rate each direction got while it copied,
to set beside link.py's (best of 5, 1 GiB, nothing else running). Steps before STEP (default:
the first step with both copies out and reloads) are left out; the figures are the median over
the steps kept, in ms, and the rates in GB/s.
"""
import argparse
import json
import os
import statistics
import sys


def read(path):
    launches, transfers = [], []
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "launch":
                start, ns = int(w[5]), int(w[6])
                if start >= 0 and ns >= 0:
                    launches.append((start, start + ns))
            elif w[0] == "transfer":
                start, ns, n, kind = int(w[1]), int(w[2]), int(w[3]), w[4]
                transfers.append((start, start + ns, n, kind))
    return launches, transfers


def union(iv):
    """Total length of the union of intervals, and the gaps between them (within their extent)."""
    iv = sorted(iv)
    busy, gaps, end = 0, [], None
    for a, b in iv:
        if end is None or a > end:
            if end is not None:
                gaps.append((end, a))
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    return busy, gaps


def direction(copies, name):
    """One direction's copies (start, end, bytes): its extent, busy time (ns) and figures."""
    first, last = min(a for a, _, _ in copies), max(b for _, b, _ in copies)
    busy, gaps = union([(a, b) for a, b, _ in copies])
    n = sum(c for _, _, c in copies)
    ms = 1e-6
    return first, last, {
        f"{name}_span": (last - first) * ms,
        f"{name}_busy": busy * ms,
        f"{name}_idle": (last - first - busy) * ms,
        f"{name}_idle_max": max((b - a for a, b in gaps), default=0) * ms,
        f"{name}_gib": n / 2**30,
        f"{name}_rate": n / busy if busy else 0.0,
        f"{name}_copies": len(copies),
    }


def step_figures(launches, transfers):
    if not launches:
        return None
    t0 = min(a for a, _ in launches)
    t_end = max(b for _, b in launches)
    out = [(a, b, n) for a, b, n, k in transfers if k == "d2h"]
    back = [(a, b, n) for a, b, n, k in transfers if k == "h2d"]
    if not out or not back:
        return None
    o0, o1, fig_out = direction(out, "out")
    i0, i1, fig_in = direction(back, "in")
    both, _ = union([(max(a, c), min(b, d)) for a, b, _ in out for c, d, _ in back if max(a, c) < min(b, d)])
    k_busy, _ = union(launches)
    ms = 1e-6
    return {
        "step": (t_end - t0) * ms,
        "kernel_busy": k_busy * ms,
        "head": (o0 - t0) * ms,
        **fig_out,
        "turn": (i0 - o1) * ms,
        **fig_in,
        "both_busy": both * ms,
        "tail": (t_end - i1) * ms,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace_dir")
    ap.add_argument("--from", dest="first", type=int, default=None)
    ap.add_argument("--link", help="link.py's JSON, for its rates beside the ones measured here")
    ap.add_argument("--json", help="write the per-step figures and their medians here")
    a = ap.parse_args()
    files = sorted(f for f in os.listdir(a.trace_dir) if f.startswith("step-") and f.endswith(".trace"))
    steps = []
    for f in files:
        n = int(f[len("step-"):-len(".trace")])
        fig = step_figures(*read(os.path.join(a.trace_dir, f)))
        if fig is not None and (a.first is None or n >= a.first):
            fig["n"] = n
            steps.append(fig)
    if not steps:
        print(f"link_use: no step in {a.trace_dir} has both copies out and reloads", file=sys.stderr)
        return 1
    keys = [k for k in steps[0] if k != "n"]
    med = {k: statistics.median(s[k] for s in steps) for k in keys}
    print(f"{a.trace_dir}: {len(steps)} steps with copies both ways (steps {steps[0]['n']}-{steps[-1]['n']}), medians")
    print(f"  step {med['step']:.1f} ms (kernels busy {med['kernel_busy']:.1f})")
    print(f"  = head {med['head']:.1f} + out span {med['out_span']:.1f} + turn {med['turn']:.1f} "
          f"+ in span {med['in_span']:.1f} + tail {med['tail']:.1f}")
    print(f"  out: {med['out_gib']:.2f} GiB in {med['out_copies']:.0f} copies, busy {med['out_busy']:.1f} ms "
          f"(idle {med['out_idle']:.1f}, longest gap {med['out_idle_max']:.2f}), {med['out_rate']:.1f} GB/s while busy")
    print(f"  in:  {med['in_gib']:.2f} GiB in {med['in_copies']:.0f} copies, busy {med['in_busy']:.1f} ms "
          f"(idle {med['in_idle']:.1f}, longest gap {med['in_idle_max']:.2f}), {med['in_rate']:.1f} GB/s while busy")
    print(f"  both directions at once: {med['both_busy']:.1f} ms")
    if a.link:
        link = json.load(open(a.link))
        h2d, d2h = link.get("h2d_gbps"), link.get("d2h_gbps")
        if h2d and d2h:
            print(f"  link.py: H2D {h2d:.1f}, D2H {d2h:.1f} GB/s; at those rates the bytes take "
                  f"{med['out_gib'] * 2**30 / d2h / 1e6:.1f} ms out and {med['in_gib'] * 2**30 / h2d / 1e6:.1f} ms in")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"steps": steps, "median": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
