#!/usr/bin/env python3
"""What making activations again could take off the link, read from recorded steps.

For each activation of a recorded step (at least --min-mib, born before the step's peak of live
bytes, touched after it) the launch that first touched it is taken as its producer. It could be
made again instead of moved when that launch is a kernel whose name does not say it draws random
numbers, touched no other allocation born at it (a second output), read at least one allocation
(a launch reading nothing is a fill, which later launches usually add into), and every allocation
it read is still alive at the activation's first use after the peak. An upper bound: a trace does
not say which launches write in place, nor which inputs are themselves evicted when it is needed.

    recompute_bound.py [--min-mib N] [--link-gbps G] TRACE...

Prints, per trace, the activations and the candidates: count, GiB, their producers' GPU time and
the time the link takes to move them one way.
"""
import argparse
import re
import sys

RANDOM = re.compile(r"philox|curand|random|randperm|distribution|dropout|bernoulli|multinomial", re.I)


def read_trace(path):
    kernels, allocs, launches = {}, {}, []
    with open(path) as f:
        for line in f:
            w = line.split()
            if not w:
                continue
            if w[0] == "kernel":
                kernels[int(w[1])] = line.split(None, 2)[2].strip()
            elif w[0] == "alloc":
                allocs[int(w[1])] = (int(w[2]), int(w[4]), int(w[5]))  # bytes, born, freed
            elif w[0] == "launch":
                n = int(w[7])
                launches.append((w[2], int(w[3]), int(w[6]), [int(x) for x in w[8:8 + n]]))  # kind, kernel, ns, allocs
    return kernels, allocs, launches


def bound(path, min_bytes, link_gbps):
    kernels, allocs, launches = read_trace(path)
    live = sum(b for b, born, _ in allocs.values() if born < 0)
    delta = {}
    for b, born, freed in allocs.values():
        if born >= 0:
            delta[born] = delta.get(born, 0) + b
        if freed >= 0:
            delta[freed] = delta.get(freed, 0) - b
    peak, peak_pos = -1, 0
    for pos in range(len(launches) + 1):
        live += delta.get(pos, 0)
        if live > peak:
            peak, peak_pos = live, pos
    touches = {}
    for pos, (_, _, _, touched) in enumerate(launches):
        for o in touched:
            touches.setdefault(o, []).append(pos)
    acts = [o for o, (b, born, freed) in allocs.items()
            if b >= min_bytes and 0 <= born <= peak_pos and any(t > peak_pos for t in touches.get(o, []))]
    out = {"trace": path, "activations": len(acts), "activation_bytes": sum(allocs[o][0] for o in acts),
           "candidates": 0, "candidate_bytes": 0, "producer_ns": 0}
    for o in acts:
        pos = touches[o][0]
        kind, kernel, ns, touched = launches[pos]
        if kind != "K" or RANDOM.search(kernels.get(kernel, "")):
            continue
        inputs = [i for i in touched if i != o]
        if not inputs or any(allocs[i][1] >= 0 and touches[i][0] == pos for i in inputs):
            continue
        first_use = min(t for t in touches[o] if t > peak_pos)
        if any(0 <= allocs[i][2] <= first_use for i in inputs):
            continue
        out["candidates"] += 1
        out["candidate_bytes"] += allocs[o][0]
        out["producer_ns"] += max(ns, 0)
    out["link_ns"] = out["candidate_bytes"] / link_gbps
    return out


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--min-mib", type=float, default=1.0)
    p.add_argument("--link-gbps", type=float, default=53.8)
    p.add_argument("traces", nargs="+")
    a = p.parse_args(argv)
    gib = float(1 << 30)
    print("| trace | activations, GiB | could be made again, GiB | their producers, ms | the link one way, ms |")
    print("|---|---:|---:|---:|---:|")
    for t in a.traces:
        r = bound(t, int(a.min_mib * (1 << 20)), a.link_gbps)
        print(f"| {t.split('/')[-1]} | {r['activations']}, {r['activation_bytes'] / gib:.2f} | "
              f"{r['candidates']}, {r['candidate_bytes'] / gib:.2f} | {r['producer_ns'] / 1e6:.2f} | "
              f"{r['link_ns'] / 1e6:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
