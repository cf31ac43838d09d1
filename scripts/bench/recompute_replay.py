#!/usr/bin/env python3
"""Recompute on the recorded steps, on the simulated driver: each trace replayed under the cap with
OFFLOAD_CAP_RECOMPUTE=1 and without, side by side.

    recompute_replay.py OFFLOADCTL [--cap 0.5] [--steps 10] TRACE...

The replay's kernels write only what they touch first after its birth (a recording does not say
which launches write in place), so this is what making ranges again can do where nothing is
written in place: an upper bound on its effect. Every byte is checked and the budget held in both
arms, or the row says FAIL.
"""
import argparse
import json
import os
import subprocess
import sys


def replay(offloadctl, trace, cap, steps, recompute):
    env = dict(os.environ)
    env.pop("OFFLOAD_CAP_RECOMPUTE", None)
    if recompute:
        env["OFFLOAD_CAP_RECOMPUTE"] = "1"
    out = subprocess.run([offloadctl, "replay", trace, "--cap", str(cap), "--steps", str(steps), "--json"],
                         env=env, capture_output=True, text=True).stdout
    return json.loads(out)["cap"]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("offloadctl")
    p.add_argument("--cap", type=float, default=0.5)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("traces", nargs="+")
    a = p.parse_args(argv)
    gib = float(1 << 30)
    print("| trace | GiB out (off -> on) | GiB in | mappings | made again (GiB) | dropped (GiB) | launches watched | checked |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for t in a.traces:
        off = replay(a.offloadctl, t, a.cap, a.steps, False)
        on = replay(a.offloadctl, t, a.cap, a.steps, True)
        r0, r1 = off["residency"], on["residency"]
        ok = "yes" if off["ok"] and on["ok"] else "FAIL"
        print(f"| {os.path.basename(t).rsplit('.', 1)[0]} | {r0['bytes_out'] / gib:.1f} -> {r1['bytes_out'] / gib:.1f} | "
              f"{r0['bytes_in'] / gib:.1f} -> {r1['bytes_in'] / gib:.1f} | {r0['maps']} -> {r1['maps']} | "
              f"{r1['recomputed']} ({r1['recomputed_bytes'] / gib:.1f}) | {r1['dropped']} ({r1['dropped_bytes'] / gib:.1f}) | "
              f"{r1['probes']} | {ok} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
