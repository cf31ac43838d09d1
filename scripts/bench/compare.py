#!/usr/bin/env python3
"""Markdown table of run.py results against a baseline.

  compare.py --baseline A.json B.json C.json ...

Each file holds the JSON object run.py wrote with --json-out, or a log containing a
`RESULT <json>` line (the last one is used). "losses" is "yes" when every step's loss has
the same float bits as the baseline's, else the first step that differs; "grads" compares
the final-step gradient sha256.
"""

import argparse
import json
import os
import sys


def load_result(path):
    """A run.py result: a JSON file, or the last RESULT line of a log; None if neither."""
    with open(path) as f:
        text = f.read()
    stripped = text.strip()
    if stripped.startswith("{"):
        return json.loads(stripped)
    lines = [ln for ln in text.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        return None
    return json.loads(lines[-1][len("RESULT "):])


def load(path):
    r = load_result(path)
    if r is None:
        sys.exit(f"compare.py: no result in {path}")
    return r


def comparable(base, r):
    """Bitwise comparisons only make sense for the same model, data and shapes."""
    return all(base.get(k) == r.get(k) for k in ("workload", "small", "seed"))


def losses_vs(base, r):
    if not comparable(base, r):
        return "n/a"
    a, b = base.get("losses_hex") or [], r.get("losses_hex") or []
    if not a or not b:
        return "n/a"
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"no (step {i})"
    return "yes" if len(a) == len(b) else f"prefix ({min(len(a), len(b))} steps)"


def grads_vs(base, r):
    if not comparable(base, r):
        return "n/a"
    a, b = base.get("grad_sha256"), r.get("grad_sha256")
    if not a or not b:
        return "n/a"
    return "yes" if a == b else "no"


def gib(v):
    return f"{v / 2**30:.2f}" if isinstance(v, (int, float)) else "n/a"


def main(argv=None):
    p = argparse.ArgumentParser(description="Compare run.py RESULT files against a baseline.")
    p.add_argument("--baseline", required=True, help="result file the others are compared with")
    p.add_argument("others", nargs="*", help="further result files")
    args = p.parse_args(argv)

    base = load(args.baseline)
    rows = [(args.baseline, base)] + [(path, load(path)) for path in args.others]
    print("| run | workload | mode | route | compile | ms/step | peak GiB | dev used GiB | losses = base | grads = base |")
    print("|---|---|---|---|---|---:|---:|---:|---|---|")
    for path, r in rows:
        is_base = path == args.baseline
        ms = r.get("ms_per_step")
        print("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |".format(
            os.path.basename(path) + (" (baseline)" if is_base else ""),
            r.get("workload"), r.get("mode"), r.get("route"), "yes" if r.get("compile") else "no",
            f"{ms:.1f}" if isinstance(ms, (int, float)) else "n/a",
            gib(r.get("peak_reserved_high_bytes")), gib(r.get("device_used_bytes")),
            "—" if is_base else losses_vs(base, r),
            "—" if is_base else grads_vs(base, r)))


if __name__ == "__main__":
    main()
