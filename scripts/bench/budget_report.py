"""Table of scripts/gpu/budget.sh's runs: budget.py's JSON files, grouped by workload.

For each run beside the workload's plain run: the first step and the median of the steady
steps (from the fourth on) with their range, against plain; the highest rise of the device's
used memory over the run against the budget; whether losses and final parameters are bitwise
equal to plain's.
A checkpointed model under liboffload (a run named ckpt-...) is compared with the checkpointed
run ("ckpt") instead: its time, its bitwise equality and its link bound.

With the link's rates (link.json from scripts/bench/link.py among the arguments), two lower
bounds on a liboffload step, per phase: forward = max(forward compute, bytes out / D2H),
backward = max(backward compute, bytes in / H2D), with plain's steady step split 1:2 between
forward and backward (a training step's usual proportion; the planner's CUPTI split is not
available without a trace). "moved" counts the bytes that crossed each way per steady step
(liboffload's residency counters from the fourth step to the end); "least" counts only what
any offload must move at that budget, plain's peak rise less the budget, each way.

A second table splits each capped run's steady step: the host's time inside the residency
manager (all of it, then its waits for copies and frees, the driver's mappings, unmappings,
handles made and released, the scans ahead, enqueuing copies, and the events' calls: queries,
records and stream waits), and the manager's operations, per step: among them its waits, and of
those the ones made to make room, to release a spare still in use, and to take back a range whose
handles were given on while it was copied out. With OFFLOAD_CAP_GRANT=apart, the grant thread's
time in access grants (grant, not in busy), the host's waits for grants, and the grants made, the
streams' waits for them on the GPU and the host's waits. With OFFLOAD_CAP_GATE, the time the gate
held copies out (gate_closed, inside map: the grants made with it closed), those grants and
the chunks queued behind it.

A third lists the steady steps that took ranges back while they were copied out (the host waits
for each one's copy out): how many, and, as means over them, the next use predicted when each went
out and the launches until it was taken back (in launches; equal when the prediction was right),
and the prefetch lead and out_lag at its eviction, then the host's wait for them in the step.

A fourth follows the host store through the steady steps: what it had mapped at their start and
at the end, the most bytes it held at once, and what it made in them, where an eviction needed it
(pinned on the training thread) and ahead of need on the worker (OFFLOAD_HOST_AHEAD).
"""
import json
import statistics
import sys
from collections import defaultdict

GiB = 2 ** 30


def steady_steps(ms):
    return ms[3:] if len(ms) > 4 else ms[1:] or ms


def steady(ms):
    tail = steady_steps(ms)
    return statistics.median(tail) if tail else float("nan")


def steady_range(ms):
    """The shortest and the longest steady step: what one run's median can be trusted to."""
    tail = steady_steps(ms)
    return f"{min(tail):.0f}-{max(tail):.0f}" if tail else "-"


def steady_counters(r):
    """The residency counters at the start of the steady steps and at the end, and the steady
    steps between them; None without them."""
    a, b = r.get("offload_at_3"), r.get("offload")
    n = len(r["step_ms"]) - 3
    return (a, b, n) if a and b and n > 0 else None


def moved_per_step(r):
    """(bytes out, bytes in) per steady step from the residency counters, or None."""
    c = steady_counters(r)
    if not c:
        return None
    a, b, n = c
    into = (b["bytes_in"] + b.get("prefetch_bytes", 0)) - (a["bytes_in"] + a.get("prefetch_bytes", 0))
    return (b["bytes_out"] - a["bytes_out"]) / n, into / n  # reloads on demand and prefetches


def handles_per_step(r):
    """Physical handles made and dropped per steady step (the residency counters), or "-"."""
    c = steady_counters(r)
    if not c or "created" not in c[1]:
        return "-"
    a, b, n = c
    return f"{(b['created'] - a['created']) / n:.0f} / {(b['released'] - a['released']) / n:.0f}"


HOST_MS = ("busy_ns", "lock_ns", "poll_ns", "poll_reap_ns", "poll_query_ns", "poll_outside_ns",
           "poll_pool_ns", "poll_room_ns", "wait_ns", "map_ns", "unmap_ns", "create_ns", "release_ns", "ahead_ns", "copy_ns", "event_ns", "host_pin_ns", "host_ahead_ns",
           "probe_ns", "grant_ns", "grant_wait_ns", "gate_closed_ns")
HOST_COUNTS = ("polls", "allocs", "reused", "refits", "maps", "alloc_maps", "unmaps", "created", "evictions", "reloads",
               "prefetch_hits", "prefetch_late", "waits", "waits_room", "waits_release", "waits_abandon",
               "recomputed", "dropped", "restored_early", "undescribed", "producers", "remake_away", "remake_stale",
               "not_producer_small", "not_producer_alone", "side_kept", "side_refused", "remake_written",
               "copied_lasting", "copied_unmade", "copied_lost", "producers_filled", "producers_updated", "unlearned", "probes_spent",
               "probes_busy", "probes_unbacked", "grants_apart", "grant_stream_waits", "grant_waits", "gate_grants", "gate_chunks")


def host_split(r):
    """Per steady step: the manager's host times in ms and its operations, or None."""
    c = steady_counters(r)
    if not c:
        return None
    a, b, n = c
    per = lambda k: (b.get(k, 0) - a.get(k, 0)) / n
    return [per(k) / 1e6 for k in HOST_MS], [per(k) for k in HOST_COUNTS]


def taken_back(r):
    """Per steady step that took ranges back while copying out: (step, how many, means over them of
    the next use predicted, the launches until taken back, the lead and out_lag then, the host's
    wait in ms); [] without the per-step counters."""
    steps = r.get("offload_steps") or []
    rows = []
    for i in range(3, len(steps)):
        a, b = steps[i - 1], steps[i]
        n = b.get("taken_back", 0) - a.get("taken_back", 0)
        if n > 0:
            mean = lambda k: (b.get(k, 0) - a.get(k, 0)) / n
            rows.append((i + 1, n, mean("taken_back_next"), mean("taken_back_after"), mean("taken_back_lead"),
                         mean("taken_back_lag"), (b.get("wait_abandon_ns", 0) - a.get("wait_abandon_ns", 0)) / 1e6))
    return rows


def host_growth(r):
    """The host store over the steady steps: GiB mapped at their start and at the end, the most
    held at once at the end, and the GiB made in them where an eviction needed it and ahead of
    need (OFFLOAD_HOST_AHEAD) with the ms a step each took; None without the counters."""
    c = steady_counters(r)
    if not c or "host_mapped" not in c[1]:
        return None
    a, b, n = c
    d = lambda k: b.get(k, 0) - a.get(k, 0)
    made = d("host_mapped") - d("host_ahead")
    return (a["host_mapped"] / GiB, b["host_mapped"] / GiB, b.get("host_peak_in_use", 0) / GiB, made / GiB,
            d("host_pin_ns") / n / 1e6, d("host_ahead") / GiB, d("host_ahead_ns") / n / 1e6)


def prefetch_leads(r):
    """Prefetches over the steady steps: used and late a step, the mean launches from a prefetch to
    its use (over those used, over the late ones) and, for the late ones, from the start of the copy
    out that put the range on the host to its prefetch; None without the counters."""
    c = steady_counters(r)
    if not c or "prefetch_hit_lead" not in c[1]:
        return None
    a, b, n = c
    d = lambda k: b.get(k, 0) - a.get(k, 0)
    hits, late = d("prefetch_hits"), d("prefetch_late")
    mean = lambda k, m: d(k) / m if m else float("nan")
    return (hits / n, late / n, mean("prefetch_hit_lead", hits), mean("prefetch_late_lead", late),
            mean("prefetch_late_out", late))


def bound_ms(plain_ms, out_b, in_b, link):
    fwd, bwd = plain_ms / 3, plain_ms * 2 / 3
    return max(fwd, out_b / (link["d2h_gbps"] * 1e6)) + max(bwd, in_b / (link["h2d_gbps"] * 1e6))


def main(paths):
    runs = defaultdict(dict)
    link = None
    for p in paths:
        r = json.load(open(p))
        if p.endswith("link.json"):
            link = r
            continue
        name = p.rsplit("/", 1)[-1][:-5]
        runs[r["workload"]][name.split("-", 1)[1] if "-" in name else name] = r
    print("| workload | run | budget GiB | peak rise GiB | within | first step ms | steady ms/step | steady range ms "
          "| x plain (ckpt-: x ckpt) "
          "| GiB out/in a step | handles made/dropped a step | x bound (moved) | x bound (least) | bitwise | error |")
    print("|---|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for w, rs in sorted(runs.items()):
        for name, r in sorted(rs.items(), key=lambda kv: (kv[0] != "plain", kv[0])):
            plain = rs.get("ckpt") if name.startswith("ckpt-") else rs.get("plain")
            base = steady(plain["step_ms"]) if plain and plain["step_ms"] else float("nan")
            budget = int(r["budget_env"]) if r["budget_env"].isdigit() else 0
            ms = r["step_ms"]
            same = "-"
            if plain and name != "plain" and not r["error"]:
                n = min(len(plain["losses"]), len(r["losses"]))
                same = "yes" if (plain["losses"][:n] == r["losses"][:n] and
                                 (len(r["losses"]) < len(plain["losses"]) or r.get("param_hash") == plain.get("param_hash"))) else "NO"
            within = "-" if not budget or r["error"] else ("yes" if r["peak_rise"] <= budget else "NO")
            st = steady(ms) if ms else float("nan")
            mv = moved_per_step(r) if budget and not r["error"] else None
            moved = xb_moved = xb_least = "-"
            if mv:
                moved = f"{mv[0] / GiB:.2f} / {mv[1] / GiB:.2f}"
            if mv and link and plain:
                least = max(0, plain["peak_rise"] - budget)
                xb_moved = f"{st / bound_ms(base, mv[0], mv[1], link):.2f}"
                xb_least = f"{st / bound_ms(base, least, least, link):.2f}"
            print(f"| {w} | {name} | {budget / GiB:.2f} | {r['peak_rise'] / GiB:.2f} | {within} | "
                  f"{ms[0] if ms else float('nan'):.1f} | {st:.1f} | {steady_range(ms) if ms else '-'} | {st / base:.2f} | {moved} | "
                  f"{handles_per_step(r) if budget and not r['error'] else '-'} | {xb_moved} | "
                  f"{xb_least} | {same} | {r['error'] or ''} |")
    split = [(w, name, r, host_split(r)) for w, rs in sorted(runs.items()) for name, r in sorted(rs.items())
             if r["budget_env"] and not r["error"]]
    if any(x[3] for x in split):
        print("\nThe steady step's host time in the residency manager (ms a step) and its operations (a step):\n")
        print("| workload | run | step ms | " + " | ".join(k[:-3] for k in HOST_MS) + " | " + " | ".join(HOST_COUNTS) + " |")
        print("|---|---|" + "---:|" * (1 + len(HOST_MS) + len(HOST_COUNTS)))
        for w, name, r, hs in split:
            if hs:
                print(f"| {w} | {name} | {steady(r['step_ms']):.1f} | " + " | ".join(f"{v:.1f}" for v in hs[0]) +
                      " | " + " | ".join(f"{v:.0f}" for v in hs[1]) + " |")
    back = [(w, name, row) for w, name, r, _ in split for row in taken_back(r)]
    if back:
        print("\nSteady steps that took ranges back while copying out (means over the ranges; launches):\n")
        print("| workload | run | step | taken back | next use predicted | used after | lead then | out_lag then | host wait ms |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for w, name, (step, n, nxt, after, lead, lag, wait) in back:
            print(f"| {w} | {name} | {step} | {n} | {nxt:.0f} | {after:.0f} | {lead:.0f} | {lag:.0f} | {wait:.1f} |")
    grown = [(w, name, g) for w, name, r, _ in split if (g := host_growth(r))]
    if grown:
        print("\nThe host store over the steady steps (GiB; ms a step):\n")
        print("| workload | run | mapped at their start | mapped at the end | most held | made where needed | "
              "its pinning ms | made ahead | its ms |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
        for w, name, g in grown:
            print(f"| {w} | {name} | " + " | ".join(f"{v:.2f}" if i < 4 or i == 5 else f"{v:.1f}"
                                                  for i, v in enumerate(g)) + " |")
    leads = [(w, name, p) for w, name, r, _ in split if (p := prefetch_leads(r))]
    if leads:
        print("\nPrefetches over the steady steps (a step; means in launches):\n")
        print("| workload | run | used | late | prefetch to use | late: prefetch to use | late: out to prefetch |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for w, name, p in leads:
            print(f"| {w} | {name} | " + " | ".join(f"{v:.0f}" for v in p) + " |")
    if link:
        print(f"\nLink: H2D {link['h2d_gbps']:.2f} GB/s, D2H {link['d2h_gbps']:.2f} GB/s (scripts/bench/link.py).")


if __name__ == "__main__":
    main(sys.argv[1:])
