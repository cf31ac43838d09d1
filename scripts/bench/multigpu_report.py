#!/usr/bin/env python3
"""Markdown report on several GPUs of one node, from the `multigpu` plan of scripts/gpu/run.sh.

  multigpu_report.py DIR

DIR is the plan's work folder; any file may be missing (the report says which, and goes on):
- `commit`, `machine.txt`, `topo.txt` (nvidia-smi topo -m);
- `link_multi.json` from link.py --gpus N: each GPU alone, all together, node_link;
- per run NAME and rank R, `NAME-rankR.json` (run.py results; a missing one is taken from a
  `RESULT` line of NAME.log with that rank, if there is one). The runs: ddp_plain,
  ddp_offload (75%, planned with the node's measured link), ddp_nolink (the same, offloadd
  without --node-link), ddp_share (75%, a host pool 1.2x what one rank leased: fair shares),
  fsdp_plain, fsdp_offload (FSDP2 with activation checkpointing, 90%);
- `NAME.log` (torchrun's output of all ranks), `NAME.status.txt` (`offloadctl status`
  samples, each after a `=== sample i` line), `NAME.status.0.json` / `NAME.status.1.json`
  (the last two `offloadctl status --json` samples; sample i is in file i % 2);
- `offloadd.log` (every daemon of the plan, appended) and `offloadd-before-share.log` (its
  copy before the fair-share daemon started).

Sections: setup (commit, machine, topology), the link alone and together, per-rank tables
for DDP and FSDP (plain against each offload run), planning with and without the node's
shared link, fair shares, one `offloadctl status` sample, checks.

Exits 1 when a correctness check fails: an offload run's losses or gradients differ from
plain's on some rank, or an offload run's result is missing for a rank whose plain result
exists (ddp_nolink and ddp_share only when the run left a log or a result: the plan skips
them on purpose at times). Everything else (budget, misses, status, leases) is reported only.

multigpu_read.py reads the files, formats the numbers and writes the fair-share section.
"""

import argparse
import glob
import json
import os
import re
import sys

from compare import load_result  # noqa: E402  (scripts/bench/ is on sys.path)
from multigpu_read import (Status, fair_shares, bits, budget_bytes, executor, find_key, first, fmt, full_sample, gib,
                           json_clients, link_text, num, pct, predicted_ms, ranks_seen, read_json, read_text,
                           sub, timed_misses)

PLAINS = ("ddp_plain", "fsdp_plain")
OFFLOADS = {"ddp_offload": "ddp_plain", "ddp_nolink": "ddp_plain", "ddp_share": "ddp_plain",
            "fsdp_offload": "fsdp_plain"}
OPTIONAL = ("ddp_nolink", "ddp_share")  # the plan runs them only when it can
SAMPLED = ("ddp_offload", "fsdp_offload", "ddp_share")  # offloadctl status sampled during these
GROUPS = [("DDP", "ddp_plain", ("ddp_offload", "ddp_nolink", "ddp_share")),
          ("FSDP2", "fsdp_plain", ("fsdp_offload",))]
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


# ---------------------------------------------------------------- the report

def topology(rows):
    """One line from nvidia-smi topo -m's matrix: how the GPUs connect pairwise, and each GPU's
    NUMA node (GPUs on one NUMA node share its host bridge)."""
    if not rows:
        return ""
    head = rows[0].split("\t")
    head = [h.strip() for h in head]
    gpus = {}  # name -> cells by column name
    for line in rows[1:]:
        cells = [c.strip() for c in line.split("\t")]
        if cells and re.fullmatch(r"GPU\d+", cells[0]):
            gpus[cells[0]] = dict(zip(head[1:], cells[1:]))
    names = sorted(gpus, key=lambda g: int(g[3:]))
    links = {}
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            links.setdefault(gpus[a].get(b, "?"), []).append(f"{a}–{b}")
    if len(links) == 1:
        (kind, pairs), = links.items()
        text = f"{len(names)} GPUs, {'every pair' if len(pairs) > 1 else pairs[0]} {kind}"
    else:
        text = "; ".join(f"{kind}: {', '.join(p)}" for kind, p in sorted(links.items()))
    numa = {}
    for g in names:
        numa.setdefault(gpus[g].get("NUMA Affinity") or "?", []).append(g)
    if any(k not in ("", "?", "N/A") for k in numa):
        text += "; NUMA node " + ", ".join(f"{k}: {', '.join(v)}" for k, v in sorted(numa.items()))
    return text


def main(argv=None):
    ap = argparse.ArgumentParser(description="Markdown report on the multigpu plan's runs.")
    ap.add_argument("dir", help="the multigpu plan's work directory")
    d = ap.parse_args(argv).dir
    missing, fails, notes = [], [], []

    if not os.path.isdir(d):
        print(f"# Several GPUs of one node: {d}\n\n- **FAIL**: no such directory")
        return 1

    # Results, per run and rank: NAME-rankR.json, else a RESULT line of NAME.log for rank R.
    results, logs, from_log = {}, {}, []
    for name in list(PLAINS) + list(OFFLOADS):
        logs[name] = read_text(os.path.join(d, f"{name}.log"))
        runs = {}
        for path in sorted(glob.glob(os.path.join(d, f"{name}-rank*.json"))):
            m = re.search(r"-rank(\d+)\.json$", path)
            if not m:
                continue
            try:
                r = load_result(path)
            except (OSError, ValueError) as e:
                notes.append(f"{os.path.basename(path)} unreadable: {e.__class__.__name__}")
                r = None
            if isinstance(r, dict):
                runs[int(m.group(1))] = r
        for line in (logs[name] or "").splitlines():
            if line.startswith("RESULT "):
                try:
                    r = json.loads(line[len("RESULT "):])
                except ValueError:
                    continue
                rk = r.get("rank") if isinstance(r, dict) else None
                if num(rk) and int(rk) not in runs:
                    runs[int(rk)] = r
                    from_log.append(f"{name}-rank{rk}")
        results[name] = runs

    link, link_err = read_json(os.path.join(d, "link_multi.json"))
    link = link if isinstance(link, dict) else {}
    sizes = [r.get("world_size") for runs in results.values() for r in runs.values() if num(r.get("world_size"))]
    ranks_found = [rk for runs in results.values() for rk in runs]
    n = int(max(sizes)) if sizes else (int(link["gpus"]) if num(link.get("gpus")) else
                                      (max(ranks_found) + 1 if ranks_found else 0))
    ranks = list(range(n))

    # What is missing.
    for f in ("commit", "machine.txt", "topo.txt", "link_multi.json", "offloadd.log", "offloadd-before-share.log"):
        if not os.path.exists(os.path.join(d, f)):
            missing.append(f)
        elif f == "link_multi.json" and link_err:
            missing.append(f"link_multi.json ({link_err})")
    for name in list(PLAINS) + list(OFFLOADS):
        lost = [f"{name}-rank{rk}.json" for rk in ranks if rk not in results[name]]
        if len(lost) == len(ranks) and ranks:
            missing.append(f"{name}-rank*.json")
        else:
            missing.extend(lost)
        if logs[name] is None:
            missing.append(f"{name}.log")
    statuses = {name: Status(d, name) for name in SAMPLED}
    for name, st in statuses.items():
        if st.text is None:
            missing.append(f"{name}.status.txt")
        for k in (0, 1):
            if k not in st.json:
                missing.append(f"{name}.status.{k}.json")

    # pid -> rank per run, from the results (shim.pid).
    pid_rank = {name: {sub(r, "shim").get("pid"): rk for rk, r in runs.items() if sub(r, "shim").get("pid")}
                for name, runs in results.items()}

    # ------------------------------------------------ 1. setup
    commit = (read_text(os.path.join(d, "commit")) or "").strip() or "unknown"
    machine = [ln.strip() for ln in (read_text(os.path.join(d, "machine.txt")) or "").splitlines() if ln.strip()]
    # nvidia-smi writes a line per GPU: alike ones once, counted.
    machine = [f"{machine.count(m)} × {m}" if machine.count(m) > 1 else m for m in dict.fromkeys(machine)]
    topo = ANSI.sub("", read_text(os.path.join(d, "topo.txt")) or "")
    topo_rows = []
    for line in topo.splitlines():
        if not line.strip():
            if topo_rows:
                break
            continue
        if re.match(r"^\s*(GPU\d|NIC\d|\s*GPU0)", line) or (not topo_rows and "GPU0" in line):
            topo_rows.append(line.rstrip())
        elif topo_rows:
            break
    any_r = next((r for runs in results.values() for r in runs.values()), {})

    print(f"# Several GPUs of one node: {d}\n")
    print(f"- **Commit:** `{commit}`")
    print(f"- **Machine:** {'; '.join(machine) if machine else 'n/a (machine.txt missing)'}")
    source = ("from the results" if sizes else
              "not in any result: from link_multi.json or the rank files" if n else "unknown: no results")
    print(f"- **Ranks:** {n if n else 'n/a'} (torchrun, one per GPU; world size {source}); "
          f"{any_r.get('warmup', '?')} warm-up + {any_r.get('steps', '?')} timed steps"
          f"{', deterministic' if any_r.get('deterministic') else ''}")
    topo_text = topology(topo_rows)
    print(f"- **Topology:** {topo_text or 'n/a (topo.txt missing or unreadable)'}")
    if missing:
        print(f"- **Missing:** {', '.join(missing)}")
    if from_log:
        print(f"- **Taken from RESULT lines of the logs** (no JSON file): {', '.join(from_log)}")
    for note in notes:
        print(f"- {note}")
    if topo_rows:
        print("\n```\n" + "\n".join(topo_rows) + "\n```")

    # ------------------------------------------------ 2. link
    print("\n## The host link: each GPU alone, all together\n")
    alone = [a for a in (link.get("alone") or []) if isinstance(a, dict)]
    tog = link.get("together") if isinstance(link.get("together"), dict) else {}
    if not alone and not tog:
        print("No link_multi.json (`link.py --gpus N`): nothing measured.")
    else:
        k = link.get("gpus") if num(link.get("gpus")) else (len(alone) or n or 1)
        cols = [("H2D", "h2d_gbps", "h2d_gbps_sum"), ("D2H", "d2h_gbps", "d2h_gbps_sum"),
                ("both ways (sum)", "both_gbps_sum", "both_gbps_sum")]
        print("| GB/s (1e9 B/s) | " + " | ".join(c[0] for c in cols) + " |")
        print("|---|" + "---:|" * len(cols))
        for i, a in enumerate(alone):
            print(f"| GPU{i} alone | " + " | ".join(fmt(a.get(c[1]), 2) for c in cols) + " |")
        means = []
        for c in cols:
            v = [a.get(c[1]) for a in alone if num(a.get(c[1]))]
            means.append(sum(v) / len(v) if v else None)
        if len(alone) > 1:
            print("| mean alone | " + " | ".join(fmt(m, 2) for m in means) + " |")
        print(f"| all {k} together, sum | " + " | ".join(fmt(tog.get(c[2]), 2) for c in cols) + " |")
        per = [tog.get(c[2]) / k if num(tog.get(c[2])) and k else None for c in cols]
        print(f"| all {k} together, per GPU | " + " | ".join(fmt(p, 2) for p in per) + " |")
        print("| drop per GPU, together vs alone | "
              + " | ".join(pct(p / m - 1) if num(p) and num(m) and m else "n/a" for p, m in zip(per, means))
              + " |")
        worst = []
        for i, a in enumerate(alone):
            for c, p in zip(cols, per):
                if num(a.get(c[1])) and num(p) and a[c[1]]:
                    worst.append((p / a[c[1]] - 1, f"GPU{i} {c[0]}"))
        if worst:
            w = min(worst)
            print(f"\nLargest drop against a GPU's own figure: {w[1]} {pct(w[0])}. offloadd's `--node-link` "
                  f"(H2D,D2H,BOTH, summed over the node): `{link.get('node_link', 'n/a')}`.")
    node_links = set()
    for st in statuses.values():
        for sj in st.json_ordered:
            lk = sub(sj, "node", "link")
            if lk:
                node_links.add(f"{fmt(first(lk, 'h2d_gbps', 'h2d'))} H2D, {fmt(first(lk, 'd2h_gbps', 'd2h'))} D2H, "
                               f"{fmt(first(lk, 'both_gbps', 'both'))} both ways (GPUs on the node: "
                               f"{sub(sj, 'node').get('gpus', '?')})")
    if node_links:
        print(f"\nThe link as offloadd held it (status JSON): {'; '.join(sorted(node_links))}.")

    # ------------------------------------------------ 3. per-rank tables
    rows = {}  # (name, rank) -> facts
    for title, plain_name, offs in GROUPS:
        # The workload as the results say (the smoke plan's FSDP pair may run another one).
        wr = next((r for nm in (plain_name,) + offs for r in results[nm].values()), {})
        what = ", ".join(x for x in (wr.get("workload"), {"ckpt": "activation checkpointing"}.get(
            wr.get("mode"), wr.get("mode") if wr.get("mode") not in (None, "plain") else None),
            "--small" if wr.get("small") else None) if x)
        print(f"\n## {title}{f' ({what})' if what else ''}, per rank\n")
        print("| run | rank | ms/step plain → offload | overhead | footprint GiB plain → offload | budget GiB "
              "| within | losses | grads | timed misses | GiB out / in per step | collectives | predicted ms "
              "| measured/predicted − 1 | link model: GPUs, H2D / D2H GB/s |")
        print("|---|---:|---|---:|---|---:|---|---|---|---:|---|---:|---:|---:|---|")
        for name in offs:
            present = bool(results[name]) or logs[name] is not None
            if not present and name in OPTIONAL:
                print(f"| {name} | — | not run |" + " |" * 12)
                continue
            if not ranks:
                print(f"| {name} | — | no results |" + " |" * 12)
                continue
            for rk in ranks:
                p, r = results[plain_name].get(rk), results[name].get(rk)
                pm = (p or {}).get("ms_per_step")
                if r is None:
                    print(f"| {name} | {rk} | {fmt(pm)} → missing |" + " — |" * 12)
                    rows[(name, rk)] = {"r": None, "p": p}
                    continue
                m, x = r.get("ms_per_step"), executor(r)
                fp, pf, bud = r.get("footprint_peak_bytes"), (p or {}).get("footprint_peak_bytes"), budget_bytes(r)
                within = (fp <= bud) if num(fp) and bud else None
                ok, lt, gt = bits(p, r)
                mi, rec = timed_misses(r)
                steps = r.get("steps") or 0
                mi_txt = "n/a" if mi is None else (f"{mi}" if rec >= steps else f"{mi} ({rec} of {steps} recorded)")
                sa = x.get("steps_active")
                if num(sa) and sa > 0:
                    moved = f"{gib((x.get('bytes_out') or 0) / sa)} / {gib((x.get('bytes_in') or 0) / sa)}"
                else:
                    moved = "0 (no active step)" if num(sa) else "n/a"
                coll = find_key(r.get("shim"), "collectives")
                pred = predicted_ms(r)
                err = m / pred - 1 if num(m) and pred else None
                rows[(name, rk)] = dict(r=r, p=p, ok=ok, lt=lt, gt=gt, within=within, fp=fp, bud=bud, misses=mi,
                                        rec=rec, pred=pred, err=err, m=m)
                over = pct(m / pm - 1) if num(m) and num(pm) and pm else "n/a"
                print(f"| {name} | {rk} | {fmt(pm)} → {fmt(m)} | {over} | {gib(pf)} → {gib(fp)} | {gib(bud)} "
                      f"| {'n/a' if within is None else ('yes' if within else 'NO')} "
                      f"| {lt} | {gt} | {mi_txt} | {moved} | {coll if coll is not None else 'n/a'} | {fmt(pred)} "
                      f"| {pct(err)} | {link_text(r)} |")
        plan_lines = []
        for name in offs:
            for rk in ranks:
                if rk in results[name]:
                    plan = executor(results[name][rk]).get("plan")
                    plan_lines.append(f"- {name} rank {rk}: {plan or '(no plan)'}")
        if plan_lines:
            print("\nThe plans (executor.plan):\n")
            print("\n".join(plan_lines))
    print("\nOverhead: offload ms/step against the same rank's plain run. Timed misses: demand reloads "
          "summed over the timed steps (the last `steps` entries of executor.recent_misses). GiB out / in: "
          "bytes evicted / reloaded per active step (executor.bytes_out, bytes_in over steps_active). "
          "Collectives: NCCL calls the shim saw. Predicted: the planner's step (predicted_step_ns). "
          "Link model: planner.link, the figures the plan was made with (both ways: each direction while "
          "the other also copies).")

    # ------------------------------------------------ 4. with and without the node's link
    print("\n## Planning with the node's shared link (ddp_offload) and without it (ddp_nolink)\n")
    if not results["ddp_nolink"] and logs["ddp_nolink"] is None:
        print("ddp_nolink did not run (it needs link_multi.json's node_link); nothing to compare.")
    else:
        print("| rank | link model with → without | predicted ms with → without | measured ms with → without "
              "| measured/predicted − 1 with → without | closer with the shared link |")
        print("|---:|---|---|---|---|---|")
        closer = []
        for rk in ranks:
            a, b = rows.get(("ddp_offload", rk)) or {}, rows.get(("ddp_nolink", rk)) or {}
            ea, eb = a.get("err"), b.get("err")
            c = None if not (num(ea) and num(eb)) else abs(ea) < abs(eb)
            if c is not None:
                closer.append(c)
            print(f"| {rk} | {link_text(a.get('r'))} → {link_text(b.get('r'))} | {fmt(a.get('pred'))} → "
                  f"{fmt(b.get('pred'))} | {fmt(a.get('m'))} → {fmt(b.get('m'))} | {pct(ea)} → {pct(eb)} "
                  f"| {'n/a' if c is None else ('yes' if c else 'no')} |")
        if closer:
            print(f"\nModelling the shared link brought the prediction closer on {sum(closer)} of {len(closer)} "
                  f"rank(s).")

    # ------------------------------------------------ 5. fair shares
    print("\n## Fair shares (ddp_share)\n")
    share_checks = fair_shares(d, results, logs, statuses.get("ddp_share"), pid_rank.get("ddp_share", {}), ranks,
                               rows)

    # ------------------------------------------------ 6. status sample
    print("\n## `offloadctl status` during ddp_offload\n")
    st = statuses["ddp_offload"]
    fs = full_sample(st, n, pid_rank["ddp_offload"]) if st.samples else None
    if fs is None:
        print("No status samples (ddp_offload.status.txt missing or empty).")
    else:
        i, lines, seen, complete = fs
        print(f"Sample {i} of {len(st.samples)}" + (", the last with every rank connected:" if complete else
              f": no sample shows all {n} ranks connected; the last with the most ({len(seen)}):"))
        print("\n```\n" + "\n".join(ANSI.sub("", ln) for ln in lines).rstrip() + "\n```")

    # ------------------------------------------------ 7. checks
    print("\n## Checks\n")
    perf = []

    def line(ok, text, fatal=False):
        print(f"- {'PASS' if ok else 'FAIL'}: {text}")
        if not ok:
            (fails if fatal else perf).append(text)

    if not any(results.values()):
        line(False, "no run.py result at all (no NAME-rankR.json, no RESULT line in a log)", True)
    for name, plain_name in OFFLOADS.items():
        ran = bool(results[name]) or logs[name] is not None
        if not ran and name in OPTIONAL:
            print(f"- SKIP: {name}: not run")
            continue
        for rk in ranks:
            p, r = results[plain_name].get(rk), results[name].get(rk)
            if r is None:
                if p is not None:
                    line(False, f"{name} rank {rk}: result missing (its plain result exists)", True)
                else:
                    print(f"- SKIP: {name} rank {rk}: neither it nor {plain_name} has a result")
                continue
            f = rows.get((name, rk)) or {}
            if p is None:
                print(f"- WARN: {name} rank {rk}: no {plain_name} result to compare with")
            elif f.get("ok") is None:
                print(f"- WARN: {name} rank {rk}: bitwise equality cannot be checked: losses {f.get('lt')}, "
                      f"grads {f.get('gt')}")
            else:
                line(f["ok"], f"{name} rank {rk}: losses {f['lt']}, grads {f['gt']} (bitwise against {plain_name})",
                     True)
            w = f.get("within")
            line(w is True, f"{name} rank {rk}: footprint {gib(f.get('fp'))} GiB within budget {gib(f.get('bud'))} GiB"
                 + ("" if w is not None else " (unknown)"))
            mi, rec, steps = f.get("misses"), f.get("rec", 0), (r.get("steps") or 0)
            text = f"{name} rank {rk}: {mi if mi is not None else 'n/a'} misses in the timed steps"
            if mi == 0 and rec < steps:
                print(f"- WARN: {text}, but only {rec} of {steps} timed steps recorded (the plan was not active "
                      f"in the others)")
            else:
                line(mi == 0, text)
    for name, stt in statuses.items():
        if not stt.samples and not stt.json_ordered:
            if results[name] or logs[name] is not None:
                line(False, f"{name}: every rank visible in offloadctl status: no samples")
            continue
        fs2 = full_sample(stt, n, pid_rank[name]) if stt.samples else None
        seen = fs2[2] if fs2 else set()
        for sj in stt.json_ordered:
            js = ranks_seen(json_clients(sj), pid_rank[name], n)
            if len(js) > len(seen):
                seen = js
        line(n > 0 and len(seen) >= n, f"{name}: every rank visible in offloadctl status at once: "
             f"{len(seen)} of {n} (ranks {', '.join(map(str, sorted(seen))) or 'none'})")
        over = []
        worst = None
        for label, pool, slack, clients in stt.all_views():
            total = sum(c["leased"] for c in clients if num(c.get("leased")))
            slack += sum(c.get("leased_slack", 0) for c in clients)
            if num(pool) and pool:
                if worst is None or total / pool > worst[0]:
                    worst = (total / pool, label, total, pool)
                if total > pool + slack:
                    over.append(label)
        if worst is None:
            print(f"- SKIP: {name}: sum of leases ≤ pool: no pool size in the samples")
        else:
            line(not over, f"{name}: sum of leases ≤ pool in every sample (largest: {gib(worst[2])} of "
                 f"{gib(worst[3])} GiB, {100 * worst[0]:.0f}%, in the {worst[1]})"
                 + (f"; over in {', '.join(over)}" if over else ""))
    for ok, text in share_checks:
        if ok is None:
            print(f"- SKIP: {text}")
        else:
            line(ok, text)

    print(f"\n**{'FAIL' if fails else 'PASS'}**: {len(fails)} correctness failure(s), "
          f"{len(perf)} other check(s) not met.")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
