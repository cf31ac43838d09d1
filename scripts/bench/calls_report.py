#!/usr/bin/env python3
"""Two arms over several calls (machines): is B's lead over A more than the calls' spread?

    calls_report.py --arms A,B --call NAME A=a1.json,a2.json B=b1.json,b2.json [--call ...]

ab_report.py compares two arms within one call, pooling their steps. Between calls the whole
machine moves (lora's step ran 4120 to 4285 ms from one call to the next, with its GPU held at its
power cap), and within a call runs of one arm can differ by more than the steps of a run do. So
here the unit is the run and the call is its block:

- per call, B's run means less the mean of A's runs in that call;
- over calls, the mean of those per-call differences with a 95% t interval over the calls
  (df = calls - 1): a lead that holds on every machine and not just on one;
- over runs, every B run less its call's A mean, with a t interval over the runs (df = runs - 1;
  runs of one call share their A mean, so this interval is the narrower, less careful one).

A run's mean is the mean of its step_ms (GPU time between timed steps' starts, from events).
"""
import argparse
import json
import math
import statistics
import sys

from ab_report import t975


def run_mean(path):
    with open(path) as f:
        r = json.load(f)
    s = r.get("step_ms") or []
    if len(s) < 2:
        sys.exit(f"{path}: no step_ms (needs scripts/bench/run.py with per-step events)")
    return statistics.fmean(s)


def interval(xs):
    """(mean, half-width of the 95% t interval); half None with fewer than two values."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, None
    return m, t975(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def verdict(name_a, name_b, m, half):
    if half is None:
        return "one value: no interval"
    if m + half < 0:
        return f"{name_b} is faster than {name_a}"
    if m - half > 0:
        return f"{name_b} is slower than {name_a}"
    return f"{name_b} is not shown different from {name_a}"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", required=True, help="A,B: the reference arm, then the one compared")
    p.add_argument("--call", nargs="+", action="append", required=True, metavar="ITEM",
                   help="NAME A=run.json,... B=run.json,...")
    p.add_argument("--md", help="also write the report here (markdown)")
    a = p.parse_args()
    name_a, name_b = a.arms.split(",")
    lines = [f"| call | {name_a} runs (mean step_ms) | {name_b} runs | {name_b} - {name_a} per run | per call |",
             "|---|---|---|---|---:|"]
    per_call, per_run = [], []
    for call in a.call:
        name, files = call[0], dict(x.split("=", 1) for x in call[1:])
        if name_a not in files or name_b not in files:
            sys.exit(f"call {name}: needs {name_a}=... and {name_b}=...")
        ra = [run_mean(f) for f in files[name_a].split(",")]
        rb = [run_mean(f) for f in files[name_b].split(",")]
        base = statistics.fmean(ra)
        diffs = [x - base for x in rb]
        per_run += diffs
        per_call.append(statistics.fmean(diffs))
        fmt = lambda xs, sign="": ", ".join(f"{x:{sign}.1f}" for x in xs)
        lines.append(f"| {name} | {fmt(ra)} | {fmt(rb)} | {fmt(diffs, '+')} | {per_call[-1]:+.1f} |")
    out = ["\n".join(lines), ""]
    for what, xs, unit in (("over calls", per_call, "calls"), ("over runs", per_run, "runs")):
        m, half = interval(xs)
        span = "" if half is None else f" (95% {m - half:+.1f} to {m + half:+.1f})"
        out.append(f"{name_b} - {name_a} {what}: {m:+.1f} ms a step{span}, {len(xs)} {unit if len(xs) > 1 else unit[:-1]}: "
                   f"{verdict(name_a, name_b, m, half)}.")
    text = "\n".join(out)
    print(text)
    if a.md:
        with open(a.md, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
