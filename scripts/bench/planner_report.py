#!/usr/bin/env python3
"""Markdown report on the GPU-time planner from the `planner` plan of scripts/gpu/run.sh.

  planner_report.py DIR

DIR holds run.py results (--json-out) of the reference workload: reference_plain.json,
reference_ckpt.json, reference_save_on_cpu.json and reference_offload_{hidden,90,75,50}.json
(any may be missing), link.json from link.py (GB/s: h2d_gbps, d2h_gbps, both_gbps_sum) and
`commit`. The offload runs carry the executor's counters and the planner's prediction
(shim.executor.planner: predicted_step_ns, forward_ns, backward_ns, bytes_moved, hidden_*).

Side by side: ms/step, footprint, budget, bitwise equality with plain (losses_hex and
grad_sha256), demand reloads and late reloads in the timed steps (the last `steps` entries of
recent_misses / recent_late), bytes moved, the planner's predicted step, and a lower bound on
the step from the measured link (see the note under the table).

Checks, each offload run: (1) footprint within the budget; (2) losses and gradients bitwise
equal to plain's; (3) measured ms/step <= 1.10 x the lower bound; (4) |measured/predicted - 1|
<= 10%; and at the hidden budget (5) overhead against plain <= 3%.
Exits 1 when a correctness check (1, 2) fails or cannot be made, or no offload result exists;
0 otherwise. Performance checks (3-5) are reported, not fatal; missing runs are listed.
"""

import argparse
import json
import os
import sys

from compare import load_result  # noqa: E402  (scripts/bench/ is on sys.path)

H2D_GBPS, D2H_GBPS, BOTH_GBPS = 53.8, 54.4, 85.0  # docs/design.md's figures, if link.json is missing
BOUND_SLACK, PREDICT_TOL, HIDDEN_OVERHEAD = 1.10, 0.10, 0.03
ROWS = [("plain", "reference_plain"), ("ckpt", "reference_ckpt"), ("save_on_cpu", "reference_save_on_cpu"),
        ("hidden", "reference_offload_hidden"), ("90", "reference_offload_90"),
        ("75", "reference_offload_75"), ("50", "reference_offload_50")]


def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def gib(v, digits=2):
    return f"{v / 2**30:.{digits}f}" if num(v) else "n/a"


def ms(v):
    return f"{v:.1f}" if num(v) else "n/a"


def executor(r):
    x = ((r or {}).get("shim") or {}).get("executor")
    return x if isinstance(x, dict) else {}


def planner(r):
    """The planner's figures for the plan the timed steps ran: run.py's timed_plan, read before
    the last step (whose gradient hash launches kernels no plan has seen, so the shim may plan
    again from a step that ends the run); else the stats at the end."""
    t = (r or {}).get("timed_plan")
    p = t.get("planner") if isinstance(t, dict) else None
    if not isinstance(p, dict):
        p = executor(r).get("planner")
    return p if isinstance(p, dict) else {}


def budget_bytes(r):
    """The executor's resolved budget, else OFFLOAD_DEVICE_BUDGET as bytes or as a fraction of
    the device; None when unknown."""
    b = executor(r).get("budget")
    if num(b) and b > 0:
        return int(b)
    b = r.get("offload_budget")
    try:
        v = float(b)
    except (TypeError, ValueError):
        return None
    if v >= 1:
        return int(v)
    return int(v * r["device_total_bytes"]) if num(r.get("device_total_bytes")) and v > 0 else None


def bitwise(plain, r):
    """(ok, text): ok is True, False, or None when it cannot be compared."""
    if plain is None:
        return None, "n.a. (no plain)"
    if plain.get("deterministic") is False or r.get("deterministic") is False:
        return None, "n.a. (not deterministic)"
    la, lb, ga, gb = plain.get("losses_hex"), r.get("losses_hex"), plain.get("grad_sha256"), r.get("grad_sha256")
    if not la or not lb or not ga or not gb:
        return None, "n.a."
    bad = [f"loss step {i}" for i, (x, y) in enumerate(zip(la, lb)) if x != y][:1]
    if len(la) != len(lb):  # e.g. save_on_cpu's 5 steps: the losses' common prefix only
        return (False, f"NO ({bad[0]})") if bad else (None, f"n.a. ({len(lb)} vs {len(la)} steps; losses equal)")
    if ga != gb:
        bad.append("grads")
    return (False, "NO (" + ", ".join(bad) + ")") if bad else (True, "yes")


def timed(r, key):
    """Sum of the last `steps` entries of executor[key] (the timed steps), or None."""
    v = executor(r).get(key)
    if not isinstance(v, list):
        return None
    steps = r.get("steps") or len(v)
    return sum(v[-steps:])


def moved_per_step(r):
    """Bytes that crossed the link each way per step under the plan: the executor's bytes_out
    (D2H) and bytes_in (H2D) over its steps_active. An arena whose reload is asked for before its
    copy out ends stays (evictions_abandoned): it crossed out and not back, so fewer bytes come
    in than go out. Falls back to the planner's bytes_moved, both ways, without those counters."""
    x, p = executor(r), planner(r)
    n, out, back = x.get("steps_active"), x.get("bytes_out"), x.get("bytes_in")
    if num(n) and n > 0 and num(out) and num(back) and out > 0:
        return out / n, back / n
    moved = p.get("bytes_moved")
    return (moved, moved) if num(moved) else (None, None)


def moved_text(r):
    out, back = moved_per_step(r)
    return f"{gib(out)} / {gib(back)}" if num(out) and num(back) else "n/a"


def lower_bound_ms(plain, r, d2h, h2d):
    """Per phase max(compute, bytes / link), summed; compute = plain's ms/step split as the
    planner's forward_ns : backward_ns; the bytes that left (D2H) in the forward and came back
    (H2D) in the backward, as measured (moved_per_step)."""
    p = planner(r)
    f, b, pm = p.get("forward_ns"), p.get("backward_ns"), (plain or {}).get("ms_per_step")
    out, back = moved_per_step(r)
    if not (num(f) and num(b) and num(out) and num(back) and num(pm)) or f + b <= 0:
        return None
    fwd, bwd = pm * f / (f + b), pm * b / (f + b)
    return max(fwd, out / (d2h * 1e9) * 1e3) + max(bwd, back / (h2d * 1e9) * 1e3)


def main(argv=None):
    ap = argparse.ArgumentParser(description="Markdown report on the GPU-time planner's runs.")
    ap.add_argument("dir", help="the planner plan's work directory")
    d = ap.parse_args(argv).dir

    runs, missing = {}, []
    for label, name in ROWS:
        path = os.path.join(d, name + ".json")
        try:
            r = load_result(path) if os.path.exists(path) else None
        except (OSError, ValueError) as e:
            print(f"<!-- unreadable {name}.json: {e} -->")
            r = None
        if isinstance(r, dict):
            runs[label] = r
        else:
            missing.append(name)
    try:
        with open(os.path.join(d, "commit")) as f:
            commit = f.read().strip() or "unknown"
    except OSError:
        commit = "unknown"
    link, link_note = {}, ""
    try:
        with open(os.path.join(d, "link.json")) as f:
            link = json.load(f)
    except (OSError, ValueError) as e:
        link_note = f" (link.json unusable: {e.__class__.__name__}; docs/design.md's figures used instead)"
    h2d = link.get("h2d_gbps") if num(link.get("h2d_gbps")) else H2D_GBPS
    d2h = link.get("d2h_gbps") if num(link.get("d2h_gbps")) else D2H_GBPS
    both = link.get("both_gbps_sum") if num(link.get("both_gbps_sum")) else (None if link else BOTH_GBPS)
    gpu = next((r.get("gpu") for r in runs.values() if r.get("gpu")), link.get("gpu", "?"))

    print(f"# Planner report: {d}\n")
    print(f"- commit: `{commit}`\n- GPU: {gpu}\n- link: H2D {h2d} GB/s, D2H {d2h} GB/s, "
          f"both at once {both if both is not None else 'n/a'} GB/s in sum{link_note}")
    if missing:
        print(f"- missing results: {', '.join(missing)}")

    plain = runs.get("plain")
    pm, pf = (plain or {}).get("ms_per_step"), (plain or {}).get("footprint_peak_bytes")
    print("\n| run | ms/step | × plain | footprint GiB | budget GiB | within budget | bitwise = plain "
          "| timed misses / late | GiB out / in per step | predicted ms/step | measured/predicted "
          "| lower bound ms | measured/bound |")
    print("|---|---:|---:|---:|---:|---|---|---|---:|---:|---:|---:|---:|")
    stats = {}
    for label, name in ROWS:
        r = runs.get(label)
        off = label not in ("plain", "ckpt", "save_on_cpu")
        bud = budget_bytes(r) if r and off else None
        title = label if not off else "offload @" + label + ("" if label == "hidden" else "%")
        if off and bud and num(pf):
            title = "offload @" + ("hidden " if label == "hidden" else "") + f"{100 * bud / pf:.0f}% ({gib(bud)} GiB)"
        if r is None:
            print(f"| {title} | missing |" + " — |" * 11)
            continue
        m, fp, p = r.get("ms_per_step"), r.get("footprint_peak_bytes"), planner(r)
        within = (fp <= bud) if num(fp) and bud else None
        ok_bits, bits_txt = bitwise(plain, r) if label != "plain" else (True, "—")
        pred = p.get("predicted_step_ns") / 1e6 if num(p.get("predicted_step_ns")) and p["predicted_step_ns"] > 0 else None
        lb = lower_bound_ms(plain, r, d2h, h2d) if off else None
        stats[label] = dict(r=r, title=title, bud=bud, within=within, bits=(ok_bits, bits_txt), pred=pred, lb=lb)
        ratio = lambda a, b: f"{a / b:.2f}" if num(a) and num(b) and b else "n/a"  # noqa: E731
        mi, la = (("n/a" if v is None else v) for v in (timed(r, "recent_misses"), timed(r, "recent_late")))
        print(f"| {title} | {ms(m)} | {ratio(m, pm)} | {gib(fp)} | {gib(bud) if off else '—'} "
              f"| {'—' if not off else {True: 'yes', False: 'NO', None: 'n/a'}[within]} | {bits_txt} "
              f"| {f'{mi} / {la}' if off else '—'} "
              f"| {moved_text(r) if off else '—'} | {ms(pred) if off else '—'} "
              f"| {ratio(m, pred) if off else '—'} | {ms(lb) if off else '—'} | {ratio(m, lb) if off else '—'} |")

    print(f"\nLower bound, per offload run: plain's measured ms/step ({ms(pm)}) split into forward and "
          "backward compute in the proportion forward_ns : backward_ns (the planner's CUPTI GPU times of "
          "the traced step); forward = max(forward compute, bytes out / D2H), backward = "
          "max(backward compute, bytes in / H2D), where bytes out and in are the executor's bytes_out and "
          "bytes_in per step under the plan (an arena asked back before its copy out ends stays: out, not "
          f"back), D2H = {d2h} GB/s and H2D = {h2d} GB/s "
          f"({'measured, link.json' if not link_note else 'docs/design.md, link.json missing'}), GB = 1e9 bytes; "
          "bound = forward + backward. Timed misses / late: demand reloads and late reloads summed over "
          "the timed steps. Percentages are of plain's footprint.")

    print("\n## Checks\n")
    fails, perf = [], []

    def line(ok, text, fatal):
        print(f"- {'PASS' if ok else 'FAIL'}: {text}")
        if not ok:
            (fails if fatal else perf).append(text)

    offs = [lb for lb, _ in ROWS[3:] if lb in stats]
    if not offs:
        line(False, "no offload result", True)
    for label in [lb for lb, _ in ROWS[3:] if lb not in stats]:
        print(f"- SKIP: offload @{label}{'' if label == 'hidden' else '%'}: no result")
    for label in offs:
        s = stats[label]
        r, t = s["r"], s["title"]
        fp = r.get("footprint_peak_bytes")
        line(s["within"] is True, f"{t}: footprint {gib(fp)} GiB within budget {gib(s['bud'])} GiB"
             + ("" if s["within"] is not None else " (unknown)"), True)
        line(s["bits"][0] is True, f"{t}: losses and gradients bitwise equal to plain: {s['bits'][1]}", True)
        m = r.get("ms_per_step")
        if num(m) and s["lb"]:
            line(m <= BOUND_SLACK * s["lb"], f"{t}: {ms(m)} ms ≤ {BOUND_SLACK:.2f} × bound {ms(s['lb'])} ms "
                 f"({m / s['lb']:.3f}×)", False)
        else:
            line(False, f"{t}: measured vs lower bound: n/a", False)
        if num(m) and s["pred"]:
            line(abs(m / s["pred"] - 1) <= PREDICT_TOL, f"{t}: measured {ms(m)} ms vs predicted {ms(s['pred'])} ms: "
                 f"{100 * (m / s['pred'] - 1):+.1f}% (limit ±{100 * PREDICT_TOL:.0f}%)", False)
        else:
            line(False, f"{t}: measured vs predicted: n/a", False)
        if label == "hidden":
            if num(m) and num(pm) and pm:
                line(m / pm - 1 <= HIDDEN_OVERHEAD, f"{t}: overhead vs plain {100 * (m / pm - 1):+.1f}% "
                     f"(limit {100 * HIDDEN_OVERHEAD:.0f}%)", False)
            else:
                line(False, f"{t}: overhead vs plain: n/a", False)

    print("\n## Planner\n")
    for label in offs:
        s = stats[label]
        p, x = planner(s["r"]), executor(s["r"])
        hb, hp = p.get("hidden_bytes"), p.get("hidden_peak")
        hp_pct = f" ({100 * hp / pf:.0f}% of plain)" if num(hp) and num(pf) and pf else ""
        print(f"- **{s['title']}**: largest hidden offload {gib(hb)} GiB, footprint {gib(hp)} GiB{hp_pct}; "
              f"gpu_time {p.get('gpu_time')}, compute {ms((p.get('compute_ns') or 0) / 1e6)} ms "
              f"(forward {ms((p.get('forward_ns') or 0) / 1e6)}, backward {ms((p.get('backward_ns') or 0) / 1e6)}), "
              f"planner's bound {ms((p.get('lower_bound_ns') or 0) / 1e6)} ms, predicted peak "
              f"{gib(p.get('predicted_peak'))} GiB, link scale {p.get('link_scale')}, revisions {p.get('revisions')}; "
              f"executor: installs {x.get('installs')}, deviations {x.get('deviations')}, steps active "
              f"{x.get('steps_active')}, misses {x.get('misses')}, late {x.get('late_reloads')}, "
              f"hand-overs {x.get('handovers')}, host waits {x.get('budget_waits')} "
              f"({ms(x.get('budget_wait_ms') or 0)} ms), gate {ms((x.get('gate_ns_mean') or 0) / 1e3)} us/launch, "
              f"out {gib(x.get('bytes_out'))} GiB in all")

    print(f"\n**{'FAIL' if fails else 'PASS'}**: {len(fails)} correctness failures, "
          f"{len(perf)} performance checks not met.")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
