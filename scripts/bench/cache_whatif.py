#!/usr/bin/env python3
"""What OFFLOAD_BLOCK_CACHE would do to a recorded step, without a GPU.

    cache_whatif.py STEP_TRACE [--bound SIZE_MIB ...] [--max-block SIZE_MIB] [--steps N]

Replays the step's allocations and frees (those born and freed within it, by launch position;
the rest stay live) N times in a row, as a training loop repeats them, through the cache's rule:
a free is kept, by exact size and stream, while the kept bytes stay within the bound (and,
with --max-block, only blocks up to that size); an
allocation takes a kept block of its size freed on its stream, else goes to the allocator.
Reports, for the last step (the cache warm), the allocations served from kept blocks, the
stream-ordered allocations and frees left to cudaMallocAsync, the most bytes kept at once, and
the most bytes live plus kept against the most live: what the pool would have to hold beyond
what the step uses, at worst (the pool may reuse a kept block's memory for no other size).
"""
import argparse
import collections


def read(path):
    """In-step allocations: (ordinal, bytes, stream, alloc_pos, free_pos); and the bytes live
    across the step (born before it or outliving it)."""
    inside, across = [], 0
    with open(path) as f:
        for line in f:
            w = line.split()
            if w and w[0] == "alloc":
                o, b, s, a, fr = int(w[1]), int(w[2]), w[3], int(w[4]), int(w[5])
                if a >= 0 and fr >= 0:
                    inside.append((o, b, s, a, fr))
                else:
                    across += b
    return inside, across


def replay(inside, across, bound, steps, max_block=None):
    # Events by position: frees before allocations at the same position (the free precedes the
    # launch its memory is reused for, as a step's temporaries are).
    events = []
    for o, b, s, a, fr in inside:
        events.append((a, 1, o, b, s))
        events.append((fr, 0, o, b, s))
    events.sort()
    kept = collections.defaultdict(int)  # (stream, bytes) -> count
    kept_bytes = kept_peak = 0
    live = peak_live = peak_both = across
    out = None
    for step in range(steps):
        hits = misses = kept_n = forwarded = 0
        kept_peak = 0
        peak_live = peak_both = live
        for pos, is_alloc, o, b, s in events:
            if is_alloc:
                if kept[(s, b)]:
                    kept[(s, b)] -= 1
                    kept_bytes -= b
                    hits += 1
                else:
                    misses += 1
                live += b
            else:
                live -= b
                if kept_bytes + b <= bound and (max_block is None or b <= max_block):
                    kept[(s, b)] += 1
                    kept_bytes += b
                    kept_n += 1
                else:
                    forwarded += 1
            kept_peak = max(kept_peak, kept_bytes)
            peak_live = max(peak_live, live)
            peak_both = max(peak_both, live + kept_bytes)
        out = dict(allocs=len(inside), hits=hits, misses=misses, kept=kept_n, forwarded=forwarded,
                   kept_peak=kept_peak, peak_live=peak_live, peak_both=peak_both)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--bound", type=float, nargs="+", default=[512, 2048, 8192], help="MiB")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--max-block", type=float, help="MiB: larger blocks are never kept")
    args = ap.parse_args()
    inside, across = read(args.trace)
    print(f"{args.trace}: {len(inside)} allocations born and freed in the step, "
          f"{across / 2**30:.2f} GiB live across it")
    for mib in args.bound:
        r = replay(inside, across, int(mib * 2**20), args.steps,
                   int(args.max_block * 2**20) if args.max_block else None)
        left = r["misses"] + r["forwarded"]
        print(f"bound {mib:g} MiB: {r['hits']} of {r['allocs']} allocations from kept blocks; "
              f"{r['misses']} allocations and {r['forwarded']} frees left to the allocator "
              f"(of {2 * r['allocs']}: {left / (2 * r['allocs']):.0%}); kept at most {r['kept_peak'] / 2**30:.2f} GiB; "
              f"live at most {r['peak_live'] / 2**30:.2f} GiB, live and kept {r['peak_both'] / 2**30:.2f} GiB "
              f"(+{(r['peak_both'] - r['peak_live']) / 2**30:.2f})")


if __name__ == "__main__":
    main()
