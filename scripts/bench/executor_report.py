#!/usr/bin/env python3
"""Markdown report on the offload executor from a directory of run.py results.

  executor_report.py DIR

Reads every DIR/*.json that run.py wrote with --json-out (or a log holding a `RESULT <json>`
line) and groups the results by workload (workload, --compile, --small, seed). In a group:
  plain        mode plain, no OFFLOAD_DEVICE_BUDGET
  offload      mode plain with OFFLOAD_DEVICE_BUDGET set (run.py records it as "offload_budget")
  ckpt, save_on_cpu
Runs under the shim without a budget (observing only) are listed but not checked.

(a) Per workload, plain against offload: losses bitwise equal (`losses_hex`), final gradients
    equal (`grad_sha256`), the device footprint (`footprint_peak_bytes`: pool reserved high +
    the executor's held_peak) of each, the budget and whether the offload footprint is within
    it, ms/step, steady-state demand reloads ("misses", the last `steps` entries of
    executor.recent_misses: the timed steps), evictions/reloads and GiB moved per step.
(b) The reference workload side by side: plain, ckpt, save_on_cpu, offload: ms/step,
    footprint, slowdown, and the PCIe lower bound on the offload step (docs/design.md's measured
    bandwidths: H2D 53.8 GB/s, D2H 54.4 GB/s, 85 GB/s both ways at once).

Exits 1 when a check fails (losses or gradients differ, or cannot be compared; footprint over
budget or unknown; a plain or offload run missing from a group that has the other), 0
otherwise; the whole report is printed either way. Misses in the timed steps, a plan that was
not active through them, or a deviation are warnings.
"""

import argparse
import glob
import os
import sys

H2D_GBPS = 53.8   # pinned host -> device, GB/s (1e9 bytes/s)
D2H_GBPS = 54.4   # device -> pinned host
BOTH_GBPS = 85.0  # both directions at once, in sum

GROUP_ORDER = {"reference": 0, "convnet": 1, "llama": 2}


from compare import load_result as load  # noqa: E402  (scripts/bench/ is on sys.path)


def executor(r):
    x = ((r or {}).get("shim") or {}).get("executor")
    return x if isinstance(x, dict) else None


def kind(r):
    if r.get("offload_budget"):
        return "offload"
    if r.get("mode") == "plain" and r.get("shim"):
        return "shim"  # observing only
    return r.get("mode") or "?"


def group_key(r):
    return (r.get("workload"), bool(r.get("compile")), bool(r.get("small")), r.get("seed"))


def group_name(key):
    w, comp, small, seed = key
    name = w + (" --compile" if comp else "") + (" --small" if small else "")
    return name + (f" (seed {seed})" if seed not in (0, None) else "")


def gib(v, digits=2):
    return f"{v / 2**30:.{digits}f}" if isinstance(v, (int, float)) else "n/a"


def ms(v):
    return f"{v:.1f}" if isinstance(v, (int, float)) else "n/a"


def budget_bytes(r):
    """The budget the executor resolved (bytes), else OFFLOAD_DEVICE_BUDGET when it is a byte
    count; None when neither is known (a fraction without an executor report)."""
    x = executor(r)
    if x and isinstance(x.get("budget"), (int, float)) and x["budget"] > 0:
        return int(x["budget"])
    b = r.get("offload_budget")
    if isinstance(b, str) and b.isdigit():
        return int(b)
    return None


def losses_check(a, b):
    """(ok, text): every step's loss has the same float bits."""
    if not a.get("deterministic") or not b.get("deterministic"):
        return False, "n/a (not --deterministic)"
    la, lb = a.get("losses_hex") or [], b.get("losses_hex") or []
    if not la or not lb:
        return False, "n/a (no losses)"
    for i, (x, y) in enumerate(zip(la, lb)):
        if x != y:
            return False, f"NO (step {i}: {x} vs {y})"
    if len(la) != len(lb):
        return False, f"NO ({len(la)} vs {len(lb)} steps)"
    return True, f"yes ({len(la)} steps)"


def grads_check(a, b):
    if not a.get("deterministic") or not b.get("deterministic"):
        return False, "n/a"
    ga, gb = a.get("grad_sha256"), b.get("grad_sha256")
    if not ga or not gb:
        return False, "n/a"
    if len(a.get("losses_hex") or []) != len(b.get("losses_hex") or []):
        return False, "n/a (different step counts)"
    return (True, "yes") if ga == gb else (False, "NO")


def transfers(r):
    """Bytes moved per active step, (out = D2H, in = H2D), or None."""
    x = executor(r)
    if not x or not x.get("steps_active"):
        return None
    n = x["steps_active"]
    return (x.get("bytes_out") or 0) / n, (x.get("bytes_in") or 0) / n


def timed_misses(r):
    """(sum, entries): demand reloads in the timed steps (the last `steps` finished active
    steps), or (None, []) when the shim kept no record."""
    x = executor(r)
    if not x or not isinstance(x.get("recent_misses"), list):
        return None, []
    recent = x["recent_misses"]
    steps = r.get("steps") or len(recent)
    tail = recent[-steps:] if steps else recent
    return sum(tail), tail


def pcie_bound(out_b, in_b):
    """Seconds per step the transfers alone need: each direction at its own rate, and both
    sharing the combined rate; the bound is the largest of the three."""
    t_d2h = out_b / (D2H_GBPS * 1e9)
    t_h2d = in_b / (H2D_GBPS * 1e9)
    t_both = (out_b + in_b) / (BOTH_GBPS * 1e9)
    return t_d2h, t_h2d, t_both, max(t_d2h, t_h2d, t_both)


def main(argv=None):
    p = argparse.ArgumentParser(description="Markdown report on the offload executor from run.py results.")
    p.add_argument("dir", help="directory of run.py --json-out files")
    args = p.parse_args(argv)

    runs = []
    for path in sorted(glob.glob(os.path.join(args.dir, "*.json"))):
        try:
            r = load(path)
        except (OSError, ValueError) as e:
            print(f"<!-- skipped {os.path.basename(path)}: {e} -->")
            continue
        if not isinstance(r, dict) or "workload" not in r or "losses_hex" not in r:
            continue
        r["_file"] = os.path.basename(path)
        runs.append(r)

    failures, warnings = [], []
    print(f"# Offload executor report: {args.dir}\n")
    if not runs:
        print("No run.py results found.")
        return 1
    gpu = next((r.get("gpu") for r in runs if r.get("gpu")), "?")
    torch_v = next((r.get("torch_version") for r in runs if r.get("torch_version")), "?")
    print(f"{len(runs)} results; GPU {gpu}; torch {torch_v}.\n")

    groups = {}
    for r in runs:
        g = groups.setdefault(group_key(r), {})
        k = kind(r)
        if k in g:
            warnings.append(f"{group_name(group_key(r))}: several {k} runs ({g[k]['_file']}, {r['_file']}); "
                            f"using {g[k]['_file']}")
            continue
        g[k] = r
    keys = sorted(groups, key=lambda k: (GROUP_ORDER.get(k[0], 9), k[0], k[1], k[2], str(k[3])))

    # ---------------------------------------------------------------- (a)
    print("## (a) Plain against offload\n")
    print("| workload | losses = plain | grads = plain | plain footprint GiB | offload footprint GiB "
          "| budget GiB | within budget | plain ms/step | offload ms/step | slowdown | timed-step misses "
          "| evictions / reloads | GiB moved/step |")
    print("|---|---|---|---:|---:|---:|---|---:|---:|---:|---|---|---:|")
    plans = []
    for key in keys:
        g = groups[key]
        name = group_name(key)
        plain, off = g.get("plain"), g.get("offload")
        if not plain and not off:
            continue
        if not plain or not off:
            have, miss = ("plain", "offload") if plain else ("offload", "plain")
            failures.append(f"{name}: {have} result present, {miss} result missing (failed or not run)")
            r = plain or off
            fp = gib(r.get("footprint_peak_bytes"))
            print(f"| {name} | MISSING {miss} | — | {fp if plain else '—'} | {fp if off else '—'} | — | — "
                  f"| {ms(r.get('ms_per_step')) if plain else '—'} | {ms(r.get('ms_per_step')) if off else '—'} "
                  f"| — | — | — | — |")
            continue
        ok_l, txt_l = losses_check(plain, off)
        ok_g, txt_g = grads_check(plain, off)
        if not ok_l:
            failures.append(f"{name}: losses {txt_l} ({plain['_file']} vs {off['_file']})")
        if not ok_g:
            failures.append(f"{name}: gradients {txt_g} ({plain['_file']} vs {off['_file']})")
        fp_off = off.get("footprint_peak_bytes")
        bud = budget_bytes(off)
        if isinstance(fp_off, (int, float)) and bud:
            within = fp_off <= bud
            within_txt = "yes" if within else f"NO (+{gib(fp_off - bud)} GiB)"
            if not within:
                failures.append(f"{name}: footprint {gib(fp_off)} GiB over the budget {gib(bud)} GiB")
        else:
            within_txt = "n/a"
            failures.append(f"{name}: footprint or budget unknown (footprint {fp_off}, "
                            f"budget {off.get('offload_budget')!r})")
        x = executor(off) or {}
        miss_sum, miss_tail = timed_misses(off)
        if miss_sum is None:
            miss_txt = "n/a"
            warnings.append(f"{name}: the offload run has no executor stats")
        else:
            miss_txt = f"{miss_sum} over {len(miss_tail)} steps" + ("" if miss_sum == 0 else f" {miss_tail}")
            if miss_sum:
                warnings.append(f"{name}: {miss_sum} demand reloads in the timed steps {miss_tail}")
        steps = off.get("steps") or 0
        if x and (not x.get("installed") or (x.get("steps_active") or 0) < steps):
            warnings.append(f"{name}: the plan was not active through the timed steps (installed="
                            f"{x.get('installed')}, steps_active={x.get('steps_active')}, timed steps={steps})")
        if x and (x.get("deviated") or x.get("deviations")):
            warnings.append(f"{name}: {x.get('deviations')} deviation(s) from the plan; deviated now: "
                            f"{x.get('deviated')}")
        if x and (x.get("over_budget") or 0) > 0:
            warnings.append(f"{name}: executor counted over_budget={x.get('over_budget')}")
        tr = transfers(off)
        moved = gib(tr[0] + tr[1]) if tr else "n/a"
        pm, om = plain.get("ms_per_step"), off.get("ms_per_step")
        slow = f"{om / pm:.2f}x" if isinstance(pm, (int, float)) and isinstance(om, (int, float)) and pm else "n/a"
        ev = f"{x.get('evictions', 'n/a')} / {x.get('reloads', 'n/a')}" if x else "n/a"
        print(f"| {name} | {txt_l} | {txt_g} | {gib(plain.get('footprint_peak_bytes'))} | {gib(fp_off)} "
              f"| {gib(bud)} ({off.get('offload_budget')}) | {within_txt} | {ms(pm)} | {ms(om)} | {slow} "
              f"| {miss_txt} | {ev} | {moved} |")
        plans.append((name, off, x))

    if plans:
        print("\nPlans and executor counters of the offload runs:\n")
        for name, off, x in plans:
            if not x:
                print(f"- **{name}** ({off['_file']}): no executor stats")
                continue
            print(f"- **{name}** ({off['_file']}): {x.get('plan') or 'no plan'}; installs {x.get('installs')}, "
                  f"deviations {x.get('deviations')}, steps active {x.get('steps_active')}, "
                  f"recent misses {x.get('recent_misses')}, total misses {x.get('misses')}, "
                  f"conservative {x.get('conservative')}, evictions abandoned {x.get('evictions_abandoned')}, "
                  f"held peak {gib(x.get('held_peak'))} GiB, executor device peak {gib(x.get('device_peak'))} GiB, "
                  f"pool reserved high {gib(off.get('peak_reserved_high_bytes'))} GiB, "
                  f"handles {x.get('handles_created')} created / {x.get('handles_released')} released, "
                  f"budget waits {x.get('budget_waits')}, over budget {x.get('over_budget')}")

    # ---------------------------------------------------------------- (b)
    ref_keys = [k for k in keys if k[0] == "reference" and not k[1]]
    ref_keys.sort(key=lambda k: k[2])  # full shapes first
    if ref_keys:
        key = ref_keys[0]
        g = groups[key]
        cols = [("plain", g.get("plain")), ("ckpt", g.get("ckpt")), ("save_on_cpu", g.get("save_on_cpu")),
                ("offload", g.get("offload"))]
        print(f"\n## (b) {group_name(key)}: ways of saving activation memory\n")
        off = g.get("offload")
        off_label = "offload"
        plain = g.get("plain")
        bud = budget_bytes(off) if off else None
        if off and bud and plain and plain.get("footprint_peak_bytes"):
            off_label = f"offload @ {100 * bud / plain['footprint_peak_bytes']:.0f}%"
        heads = [c if c != "offload" else off_label for c, _ in cols]
        print("| | " + " | ".join(heads) + " |")
        print("|---|" + "---:|" * len(cols))
        pm = plain.get("ms_per_step") if plain else None
        pf = plain.get("footprint_peak_bytes") if plain else None

        def row(label, fn):
            cells = []
            for _, r in cols:
                cells.append("—" if r is None else fn(r))
            print(f"| {label} | " + " | ".join(cells) + " |")

        row("ms/step", lambda r: ms(r.get("ms_per_step")))
        row("steps timed (warm-up)", lambda r: f"{r.get('steps')} ({r.get('warmup')})")
        row("footprint peak GiB", lambda r: gib(r.get("footprint_peak_bytes")))
        row("footprint vs plain", lambda r: f"{100 * r['footprint_peak_bytes'] / pf:.0f}%"
            if pf and isinstance(r.get("footprint_peak_bytes"), (int, float)) else "n/a")
        row("slowdown vs plain", lambda r: f"{r['ms_per_step'] / pm:.2f}x"
            if pm and isinstance(r.get("ms_per_step"), (int, float)) else "n/a")

        tr = transfers(off) if off else None
        bound = pcie_bound(*tr) if tr else None

        def bound_cell(r):
            if r is not off or not bound:
                return "—"
            lb = max(pm or 0.0, bound[3] * 1e3)
            return f"{bound[3] * 1e3:.1f} ms transfers; step ≥ {lb:.1f}"
        row("PCIe lower bound", bound_cell)

        if off and bound:
            out_b, in_b = tr
            t_d2h, t_h2d, t_both, t = bound
            lb = max(pm or 0.0, t * 1e3)
            om = off.get("ms_per_step")
            print(f"\nPCIe lower bound for the offload run: per active step {out_b / 1e9:.2f} GB out (D2H) and "
                  f"{in_b / 1e9:.2f} GB in (H2D) ({gib(out_b + in_b)} GiB in all).\n")
            print("| transfer | time per step ms |")
            print("|---|---:|")
            print(f"| D2H alone at {D2H_GBPS} GB/s | {t_d2h * 1e3:.1f} |")
            print(f"| H2D alone at {H2D_GBPS} GB/s | {t_h2d * 1e3:.1f} |")
            print(f"| both sharing {BOTH_GBPS} GB/s | {t_both * 1e3:.1f} |")
            print(f"| transfers (largest of the three) | {t * 1e3:.1f} |")
            print(f"| plain compute | {ms(pm)} |")
            print(f"| lower bound on the step = max(plain, transfers) | {lb:.1f} |")
            if isinstance(om, (int, float)) and lb:
                print(f"| measured offload step | {om:.1f} ({om / lb:.2f}x the bound) |")
        elif off:
            print("\nNo PCIe bound: the offload run has no executor transfer counters.")

    # ---------------------------------------------------------------- other runs
    others = [(group_name(k), r) for k in keys for kd, r in groups[k].items() if kd not in ("plain", "offload")
              and not (ref_keys and k == ref_keys[0] and kd in ("ckpt", "save_on_cpu"))]
    if others:
        print("\n## Other results\n")
        print("| file | workload | kind | ms/step | footprint GiB |")
        print("|---|---|---|---:|---:|")
        for name, r in others:
            print(f"| {r['_file']} | {name} | {kind(r)} | {ms(r.get('ms_per_step'))} "
                  f"| {gib(r.get('footprint_peak_bytes'))} |")

    print("\n## Verdict\n")
    for w in warnings:
        print(f"- warning: {w}")
    for f in failures:
        print(f"- FAIL: {f}")
    print(f"\n**{'FAIL' if failures else 'PASS'}**: {len(failures)} failed checks, {len(warnings)} warnings.")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
