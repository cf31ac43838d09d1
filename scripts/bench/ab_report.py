#!/usr/bin/env python3
"""Two arms run alternately on one GPU (A B B A ...): per-run and per-arm step times.

    ab_report.py --a NAME=a1.json,a2.json --b NAME=b1.json,b2.json [--md out.md]

Each run's JSON (scripts/bench/run.py --json-out) holds ms_per_step (host wall time over the timed
steps) and step_ms (GPU time between the starts of consecutive timed steps, from events). The arm
comparison pools the step_ms of its runs: mean difference B - A with a 95% interval (Welch), so
that a difference smaller than the steps' spread is reported as such and not as a win.
"""
import argparse
import json
import math
import statistics
import sys


def arm(spec):
    name, _, files = spec.partition("=")
    runs = []
    for f in files.split(","):
        with open(f) as fh:
            r = json.load(fh)
        runs.append((f, r))
    return name, runs


# Two-sided 97.5% t quantiles by degrees of freedom (the next tabled df at or above); the
# normal's beyond the table.
T975 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26,
        10: 2.23, 12: 2.18, 15: 2.13, 20: 2.09, 25: 2.06, 30: 2.04}


def t975(df):
    for k in sorted(T975):
        if df <= k:
            return T975[k]
    return 1.96


def welch(a, b):
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    va, vb = statistics.variance(a), statistics.variance(b)
    se = math.sqrt(va / len(a) + vb / len(b))
    # Welch-Satterthwaite degrees of freedom.
    df = se**4 / ((va / len(a)) ** 2 / (len(a) - 1) + (vb / len(b)) ** 2 / (len(b) - 1)) if se else 1e9
    return mb - ma, t975(df) * se, df


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", required=True, help="NAME=run1.json,run2.json,...")
    p.add_argument("--b", required=True, help="NAME=run1.json,run2.json,...")
    p.add_argument("--md", help="also write the table here (markdown)")
    args = p.parse_args()
    arms = [arm(args.a), arm(args.b)]
    lines = ["| arm | run | ms/step (wall) | step_ms median | mean | min | max | n | bitwise |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    ref = arms[0][1][0][1]
    pooled = {}
    for name, runs in arms:
        pooled[name] = []
        for f, r in runs:
            s = r.get("step_ms") or []
            if len(s) < 2:
                sys.exit(f"{f}: no step_ms (needs scripts/bench/run.py with per-step events and --steps >= 3)")
            pooled[name] += s
            same = r["losses_hex"] == ref["losses_hex"] and r["grad_sha256"] == ref["grad_sha256"]
            lines.append(f"| {name} | {f.rsplit('/', 1)[-1]} | {r['ms_per_step']:.1f} | {statistics.median(s):.1f} | "
                         f"{statistics.fmean(s):.1f} | {min(s):.1f} | {max(s):.1f} | {len(s)} | {'yes' if same else 'NO'} |")
    (na, a), (nb, b) = list(pooled.items())
    d, half, df = welch(a, b)
    wall = lambda runs: statistics.fmean(r["ms_per_step"] for _, r in runs)
    # Runs of one arm can differ by more than the steps within a run do (two baseline runs of
    # lora 18.6 ms apart): then the pooled steps' interval overstates what is known, and the
    # verdict says so.
    run_means = {name: [statistics.fmean(r["step_ms"]) for _, r in runs] for name, runs in arms}
    spread = max(max(m) - min(m) for m in run_means.values())
    verdict = ("faster than" if d + half < 0 else "slower than" if d - half > 0 else "not distinguishable from")
    caution = ""
    if spread > abs(d):
        verdict = "not shown different from"
        caution = (f" Runs of one arm differ by up to {spread:.1f} ms, more than the difference; the runs' means: " +
                   "; ".join(f"{k} " + ", ".join(f"{v:.1f}" for v in m) for k, m in run_means.items()) + ".")
    summary = (f"{nb} - {na}: {d:+.1f} ms a step on the GPU (95% interval {d - half:+.1f} to {d + half:+.1f}, "
               f"{len(a)} and {len(b)} steps, Welch df {df:.0f}): {nb} is {verdict} {na}. "
               f"Wall-clock means: {na} {wall(arms[0][1]):.1f}, {nb} {wall(arms[1][1]):.1f} ms/step.{caution}")
    out = "\n".join(lines + ["", summary])
    print(out)
    if args.md:
        with open(args.md, "w") as fh:
            fh.write(out + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
