"""Table of scripts/gpu/budget.sh's runs: budget.py's JSON files, grouped by workload.

For each run beside the workload's plain run: the first step and the median of the steady
steps (from the fourth on), against plain; the highest rise of the device's used memory over
the run against the budget; whether losses and final parameters are bitwise equal to plain's.
"""
import json
import statistics
import sys
from collections import defaultdict

GiB = 2 ** 30


def steady(ms):
    tail = ms[3:] if len(ms) > 4 else ms[1:] or ms
    return statistics.median(tail) if tail else float("nan")


def main(paths):
    runs = defaultdict(dict)
    for p in paths:
        r = json.load(open(p))
        name = p.rsplit("/", 1)[-1][:-5]
        runs[r["workload"]][name.split("-", 1)[1] if "-" in name else name] = r
    print("| workload | run | budget GiB | peak rise GiB | within | first step ms | steady ms/step | x plain | bitwise | error |")
    print("|---|---|---:|---:|---|---:|---:|---:|---|---|")
    for w, rs in sorted(runs.items()):
        plain = rs.get("plain")
        base = steady(plain["step_ms"]) if plain and plain["step_ms"] else float("nan")
        for name, r in sorted(rs.items(), key=lambda kv: (kv[0] != "plain", kv[0])):
            budget = int(r["budget_env"]) if r["budget_env"].isdigit() else 0
            ms = r["step_ms"]
            same = "-"
            if plain and name != "plain" and not r["error"]:
                n = min(len(plain["losses"]), len(r["losses"]))
                same = "yes" if (plain["losses"][:n] == r["losses"][:n] and
                                 (len(r["losses"]) < len(plain["losses"]) or r.get("param_hash") == plain.get("param_hash"))) else "NO"
            within = "-" if not budget else ("yes" if r["peak_rise"] <= budget else "NO")
            st = steady(ms) if ms else float("nan")
            print(f"| {w} | {name} | {budget / GiB:.2f} | {r['peak_rise'] / GiB:.2f} | {within} | "
                  f"{ms[0] if ms else float('nan'):.1f} | {st:.1f} | {st / base:.2f} | {same} | {r['error'] or ''} |")


if __name__ == "__main__":
    main(sys.argv[1:])
