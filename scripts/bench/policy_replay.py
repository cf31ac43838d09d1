#!/usr/bin/env python3
"""The cap's policies side by side on the recorded steps, on the simulated driver: each trace
replayed under `offloadctl replay --cap` once per arm (an arm is a set of OFFLOAD_CAP_* settings).

    policy_replay.py OFFLOADCTL [--caps 0.5,0.75,0.9] [--steps 10] [--from 3] ARM... -- TRACE...

An ARM is NAME: or NAME:VAR=VALUE[,VAR=VALUE...] (NAME: alone runs the defaults). Each cell is a
steady step's mean from step --from on: the mappings (the driver calls that bound the capped step
on the H200, docs/results.md), the handles made, the demand reloads, the host's waits for copies
and frees (the simulated GPU runs a random number of operations behind the host, whatever their
bytes, so these count waits, not their time) and the GiB copied out. Every
byte is checked and the budget held in every run, or the cell says FAIL.
"""
import argparse
import json
import os
import subprocess
import sys

COLUMNS = ("maps", "created", "reloads", "waits", "bytes_out")


def replay(offloadctl, trace, cap, steps, settings):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OFFLOAD_CAP_")}
    env.update(settings)
    out = subprocess.run([offloadctl, "replay", trace, "--cap", str(cap), "--steps", str(steps), "--json"],
                         env=env, capture_output=True, text=True).stdout
    return json.loads(out)["cap"]


def steady(cap, first):
    """Means a step over the steps from `first` on, and whether the run was checked and held."""
    steps = cap["per_step"][first:]
    ok = bool(cap.get("within_budget")) and cap.get("mismatches", 1) == 0 and bool(steps)
    n = max(len(steps), 1)
    means = {c: sum(s[c] for s in steps) / n for c in COLUMNS}
    return means, ok


def parse_arm(text):
    name, _, rest = text.partition(":")
    settings = dict(kv.split("=", 1) for kv in rest.split(",") if kv)
    return name, settings


def main(argv):
    if "--" not in argv:
        sys.exit(__doc__)
    cut = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("offloadctl")
    p.add_argument("--caps", default="0.5,0.75,0.9")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--from", dest="first", type=int, default=3)
    p.add_argument("arms", nargs="+")
    a = p.parse_args(argv[:cut])
    traces = argv[cut + 1:]
    arms = [parse_arm(t) for t in a.arms]
    names = " | ".join(n for n, _ in arms)
    print(f"A steady step (the mean of steps {a.first}-{a.steps - 1}): mappings / handles made / demand reloads / "
          f"host waits, GiB copied out; arms: {names}\n")
    print("| trace | cap | " + " | ".join(n for n, _ in arms) + " |")
    print("|---|---:|" + "---:|" * len(arms))
    for trace in traces:
        for cap in (float(c) for c in a.caps.split(",")):
            cells = []
            for _, settings in arms:
                means, ok = steady(replay(a.offloadctl, trace, cap, a.steps, settings), a.first)
                cell = (f"{means['maps']:.0f} / {means['created']:.0f} / {means['reloads']:.0f} / {means['waits']:.0f}, "
                        f"{means['bytes_out'] / float(1 << 30):.2f}")
                cells.append(cell if ok else "FAIL")
            label = os.path.basename(trace).rsplit(".", 1)[0]
            print(f"| {label} | {cap:g} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
