"""The fair-share section of multigpu_report.py: ddp_share, a host pool smaller than the ranks ask
for together; the pool, each rank's lease against its fair share, the plans, and the checks."""

import os

from multigpu_read import (daemon_run_facts, daemon_runs, executor, first, gib, log_lines, num, rank_of,
                           read_text, sub)


def fair_shares(d, results, logs, status, pid_rank, ranks, rows):
    """Prints the fair-share section; returns [(ok or None, text)] for the checks."""
    checks = []
    runs = results["ddp_share"]
    if not runs and logs["ddp_share"] is None:
        print("ddp_share did not run (it needs ddp_offload's host_bytes); nothing to report.")
        return [(None, "ddp_share: fair shares: not run")]

    # Pool size: status (JSON, then text), else the share daemon's 'serving' line.
    before = read_text(os.path.join(d, "offloadd-before-share.log"))
    full = read_text(os.path.join(d, "offloadd.log"))
    share_log = None
    if full is not None and before is not None and full.startswith(before) and len(full) > len(before):
        share_log = full[len(before):]
    elif full is not None:
        sess = daemon_runs(full)
        if sess and (before is None or len(sess) > len(daemon_runs(before))):
            share_log = "\n".join(sess[-1])
    facts = daemon_run_facts((share_log or "").splitlines())
    pool, pool_src = None, None
    for sj in status.json_ordered if status else []:
        if num(first(sj, "pool_bytes", "pool")):
            pool, pool_src = first(sj, "pool_bytes", "pool"), "status JSON"
            break
    if pool is None and facts["pool"]:
        pool, pool_src = facts["pool"], "offloadd.log"
    if pool is None and status:
        for _, _, s in status.samples:
            if s["pool"]:
                pool, pool_src = s["pool"], "status text (rounded)"
    lease0 = executor(results["ddp_offload"].get(0)).get("host_bytes")
    expect = (lease0 * 12 // 10 >> 20) << 20 if num(lease0) and lease0 > 0 else None
    print(f"- **Pool:** {gib(pool)} GiB ({pool_src or 'not found'}); the plan asked for 1.2 × rank 0's lease in "
          f"ddp_offload ({gib(lease0)} GiB) = {gib(expect)} GiB, {len(ranks)} ranks: "
          f"{gib(pool / len(ranks)) if num(pool) and ranks else 'n/a'} GiB each if shared evenly.")

    # Per client: the largest lease seen and the fair share next to it, over all samples.
    per = {}  # rank (or pid string) -> {leased, fair, over}

    def note(key, leased, fair, src, slack):
        e = per.setdefault(key, {"leased": None, "fair": None, "over": [], "src": set()})
        e["src"].add(src)
        if num(leased) and (e["leased"] is None or leased > e["leased"]):
            e["leased"] = leased
            if num(fair):
                e["fair"] = fair
        elif num(fair) and e["fair"] is None:
            e["fair"] = fair
        if num(leased) and num(fair) and fair > 0 and leased > fair + slack:
            e["over"].append(src)

    pid_rank = dict(pid_rank)  # the share daemon's log knows the ranks that attached
    for pid, f in facts["pids"].items():
        if f.get("rank") is not None and f["rank"] >= 0:
            pid_rank.setdefault(pid, f["rank"])
    if status:
        for label, _, _, clients in status.all_views():
            for c in clients:
                rk = rank_of(c, pid_rank)
                note(rk if rk is not None else f"pid {c.get('pid')}", c.get("leased"), c.get("fair_share"), label,
                     c.get("slack", 0))
    pid_of = {rk: pid for pid, rk in pid_rank.items()}
    fair_even = pool // len(ranks) if num(pool) and ranks else None

    print("\n| rank | pid | leased, largest seen GiB | fair share GiB | plan's host_bytes GiB | freed at exit GiB "
          "| over its fair share | budget GiB | footprint GiB | budget met | bitwise = plain |")
    print("|---:|---:|---:|---:|---:|---:|---|---:|---:|---|---|")
    any_over, seen_any = [], False
    for rk in ranks:
        r = runs.get(rk)
        x = executor(r)
        pid = sub(r, "shim").get("pid") or pid_of.get(rk)
        e = per.get(rk) or per.get(f"pid {pid}") or {}
        freed = (facts["pids"].get(pid) or {}).get("freed") if pid else None
        fair = e.get("fair") if num(e.get("fair")) else None
        hb = x.get("host_bytes")
        ref_fair = fair if fair is not None else fair_even
        over = list(e.get("over") or [])
        for v, src in ((hb, "host_bytes"), (freed, "freed at exit")):
            if num(v) and num(ref_fair) and ref_fair > 0 and v > ref_fair:
                over.append(src + ("" if fair is not None else " vs pool/N"))
        if e or num(hb) or num(freed):
            seen_any = True
        if over:
            any_over.append(f"rank {rk} ({', '.join(sorted(set(over))[:3])})")
        f = rows.get(("ddp_share", rk)) or {}
        w = f.get("within")
        over_txt = "yes: " + ", ".join(sorted(set(over))[:3]) if over else ("no" if e or num(hb) else "n/a")
        print(f"| {rk} | {pid or 'n/a'} | {gib(e.get('leased'))} | {gib(fair)}"
              f"{'' if fair is not None or fair_even is None else f' (pool/N {gib(fair_even)})'} | {gib(hb)} "
              f"| {gib(freed)} | {over_txt} "
              f"| {gib(f.get('bud'))} | {gib(f.get('fp'))} | {'n/a' if w is None else ('yes' if w else 'NO')} "
              f"| {'n/a' if r is None else ('yes' if f.get('ok') else ('NO' if f.get('ok') is False else 'n/a'))} |")
    print("\n" + (f"Over its fair share: {'; '.join(any_over)}." if any_over else
                  "No rank went over its fair share." if seen_any else "No rank's lease found."))
    others = [k for k in per if isinstance(k, str)]
    if others:
        print(f"\nClients not matched to a rank: {', '.join(others)}.")
    print("\nLeased, largest seen: over the status samples (text samples are rounded to 0.1 of their unit). "
          "Freed at exit: the bytes offloadd took back when the rank disconnected (offloadd.log, the "
          "fair-share daemon's part). Over its fair share: a lease above the share offloadd reported next to "
          "it (else above pool / ranks); offloadd lets a client past its share only from what the others do "
          "not need.")
    print("\nThe plans:\n")
    for rk in ranks:
        plan = executor(runs.get(rk)).get("plan")
        print(f"- rank {rk}: {plan or 'n/a'}")
    lines = log_lines(logs["ddp_share"], (": plan:", "host pool refused", "fair share", "share the host link",
                                          "not offloading", "[offload warn", "[offload error"))
    if lines:
        print("\nddp_share.log, the plans', the pool's and the link's lines (torchrun interleaves the ranks; "
              "×N: seen N times):\n\n```")
        for text, cnt in lines[:20]:
            print(text[:400] + (f"  ×{cnt}" if cnt > 1 else ""))
        if len(lines) > 20:
            print(f"... {len(lines) - 20} more")
        print("```")
    refused = sum(c for t, c in lines if "host pool refused" in t)
    print(f"\n- host pool refusals in ddp_share.log: {refused}")
    if not seen_any:
        checks.append((None, "ddp_share: no rank's lease found (status samples, results, offloadd.log)"))
    else:
        checks.append((not any_over, "ddp_share: no rank over its fair share" +
                       (f": over: {'; '.join(any_over)}" if any_over else "")))
    hbs = [executor(runs.get(rk)).get("host_bytes") for rk in ranks]
    if num(pool) and hbs and all(num(v) for v in hbs):
        ok = sum(hbs) <= pool
        checks.append((ok, f"ddp_share: the plans' host_bytes sum to {sum(hbs) / 2**20:.1f} MiB, "
                           f"{'≤' if ok else '>'} the pool's {pool / 2**20:.1f} MiB"))
    return checks
