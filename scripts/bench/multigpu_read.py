"""What multigpu_report.py reads from the multigpu plan's folder, and the number formats it prints
them in: fields of run.py's results, `offloadctl status` samples (text and JSON), offloadd's log;
and its fair-share section (fair_shares)."""

import json
import os
import re

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


# ---------------------------------------------------------------- small helpers

def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def gib(v, digits=2):
    return f"{v / 2**30:.{digits}f}" if num(v) else "n/a"


def fmt(v, digits=1):
    return f"{v:.{digits}f}" if num(v) else "n/a"


def pct(v):
    return f"{100 * v:+.1f}%" if num(v) else "n/a"


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_json(path):
    text = read_text(path)
    if text is None:
        return None, "missing"
    try:
        return json.loads(text), None
    except ValueError as e:
        return None, f"unreadable ({e.__class__.__name__})"


def sub(d, *keys):
    """d[k0][k1]... as a dict ({} where absent or not a dict)."""
    for k in keys:
        d = d.get(k) if isinstance(d, dict) else None
    return d if isinstance(d, dict) else {}


def first(d, *keys):
    """The first of keys present in dict d with a value that is not None."""
    for k in keys:
        if isinstance(d, dict) and d.get(k) is not None:
            return d[k]
    return None


def find_key(d, key):
    """The first value under key anywhere in a nested dict/list (breadth first), or None."""
    todo = [d]
    while todo:
        x = todo.pop(0)
        if isinstance(x, dict):
            if key in x and x[key] is not None:
                return x[key]
            todo.extend(x.values())
        elif isinstance(x, list):
            todo.extend(x)
    return None


def executor(r):
    return sub(r, "shim", "executor")


def planner(r):
    return sub(r, "shim", "executor", "planner")


def budget_bytes(r):
    """The executor's resolved budget, else OFFLOAD_DEVICE_BUDGET as bytes or as a fraction of
    the device; None when unknown."""
    b = executor(r).get("budget")
    if num(b) and b > 0:
        return int(b)
    try:
        v = float((r or {}).get("offload_budget"))
    except (TypeError, ValueError):
        return None
    if v >= 1:
        return int(v)
    total = (r or {}).get("device_total_bytes")
    return int(v * total) if num(total) and v > 0 else None


def timed_misses(r):
    """(sum over the timed steps, steps recorded among them) from executor.recent_misses."""
    v = executor(r).get("recent_misses")
    if not isinstance(v, list):
        return None, 0
    steps = (r or {}).get("steps") or len(v)
    tail = [x for x in v[-steps:] if num(x)]
    return sum(tail), len(tail)


def predicted_ms(r):
    p = planner(r).get("predicted_step_ns")
    return p / 1e6 if num(p) and p > 0 else None


def link_text(r):
    """The link model the plan used: planner.link {gpus, h2d, d2h, h2d_shared, d2h_shared}."""
    lk = planner(r).get("link")
    if not isinstance(lk, dict) or not lk:
        return "n/a"
    g, h, d = lk.get("gpus"), first(lk, "h2d", "h2d_gbps"), first(lk, "d2h", "d2h_gbps")
    hs, ds = first(lk, "h2d_shared"), first(lk, "d2h_shared")
    t = f"{g if g is not None else '?'} GPU{'' if g == 1 else 's'}: {fmt(h)} / {fmt(d)}"
    if num(hs) or num(ds):
        t += f" (both ways {fmt(hs)} / {fmt(ds)})"
    return t


def bits(plain, r):
    """(ok, losses text, grads text); ok is True, False, or None when it cannot be compared."""
    if plain is None or r is None:
        return None, "n/a", "n/a"
    if plain.get("deterministic") is False or r.get("deterministic") is False:
        return None, "n/a (not deterministic)", "n/a"
    for k in ("workload", "small", "seed", "steps", "warmup"):
        if k in plain and k in r and plain[k] != r[k]:
            return None, f"n/a ({k} differs)", "n/a"
    la, lb, ga, gb = plain.get("losses_hex"), r.get("losses_hex"), plain.get("grad_sha256"), r.get("grad_sha256")
    lt, gt, l_ok, g_ok = "n/a", "n/a", None, None
    if la and lb:
        bad = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), None)
        if bad is not None:
            lt, l_ok = f"DIFFER (step {bad})", False
        elif len(la) != len(lb):
            lt, l_ok = f"DIFFER ({len(lb)} vs {len(la)} steps)", False
        else:
            lt, l_ok = "same", True
    if ga and gb:
        gt, g_ok = ("same", True) if ga == gb else ("DIFFER", False)
    ok = False if False in (l_ok, g_ok) else (True if l_ok and g_ok else None)
    return ok, lt, gt


def human_bytes(text):
    m = re.fullmatch(r"\s*([\d.]+)\s*(B|KiB|MiB|GiB|TiB)\s*", text or "")
    return int(float(m.group(1)) * UNITS[m.group(2)]) if m else None


def human_slack(text):
    """How far off human_bytes(text) may be: offloadctl prints one decimal of its unit."""
    m = re.fullmatch(r"\s*[\d.]+\s*(B|KiB|MiB|GiB|TiB)\s*", text or "")
    return UNITS[m.group(1)] // 20 if m and m.group(1) != "B" else 0


# ---------------------------------------------------------------- offloadctl status

SIZE = r"[\d.]+ (?:B|KiB|MiB|GiB|TiB)"
ROW = re.compile(rf"^(\d+)\s+(.*?)\s+(-?\d+)\s+({SIZE})\s+({SIZE})\s+({SIZE})\s+({SIZE})\s+([\d.]+)\s+([\d.]+)\s+(\d+)"
                 r"(?:\s+(\S+)\s+(\S+)\s+(\S+))?\s*$")
POOL = re.compile(rf"^pool: ({SIZE}), used ({SIZE}), free ({SIZE})")


def status_samples(text):
    """[(i, [lines])] of a NAME.status.txt."""
    out = []
    for line in (text or "").splitlines():
        m = re.match(r"^=== sample (\d+)", line)
        if m:
            out.append((int(m.group(1)), []))
        elif out:
            out[-1][1].append(line)
    return out


def parse_sample(lines):
    """{pool, used, clients: [{pid, command, gpu, leased, fair_share, connected, rank}]} of one
    status table (sizes parsed back from their one-decimal text: approximate)."""
    s = {"pool": None, "used": None, "clients": [], "node": None, "pool_slack": 0}
    for line in lines:
        m = POOL.match(line)
        if m:
            s["pool"], s["used"] = human_bytes(m.group(1)), human_bytes(m.group(2))
            s["pool_slack"] = human_slack(m.group(1))
            continue
        if line.startswith("node:"):
            s["node"] = line.strip()
            continue
        m = ROW.match(line)
        if m:
            rank = m.group(11)
            s["clients"].append({
                "pid": int(m.group(1)), "command": m.group(2), "gpu": int(m.group(3)),
                "leased": human_bytes(m.group(4)), "fair_share": human_bytes(m.group(5)),
                "slack": human_slack(m.group(4)) + human_slack(m.group(5)), "leased_slack": human_slack(m.group(4)),
                "connected": "(not connected)" not in m.group(2) and "(not conn" not in m.group(2),
                "rank": int(rank) if rank and rank.lstrip("-").isdigit() else None})
    return s


def json_clients(st):
    """The status JSON's clients in the same shape as parse_sample's (key names tolerated)."""
    out = []
    for c in (st or {}).get("clients") or []:
        if not isinstance(c, dict):
            continue
        rank = first(c, "rank")
        out.append({"pid": first(c, "pid"), "command": first(c, "command") or "",
                    "gpu": first(c, "gpu", "device"),
                    "leased": first(c, "leased_bytes", "leased", "lease_bytes"),
                    "fair_share": first(c, "fair_share_bytes", "fair_share", "share_bytes"),
                    "connected": first(c, "connected") is not False,
                    "rank": rank if num(rank) and rank >= 0 else None,
                    "gpu_id": first(c, "gpu_id", "uuid"),
                    "device_budget": first(c, "device_budget", "device_budget_bytes")})
    return out


def rank_of(client, pid_rank):
    if client.get("rank") is not None:
        return client["rank"]
    return pid_rank.get(client.get("pid"))


class Status:
    """A sampled run's offloadctl status: text samples and the last two JSON samples."""

    def __init__(self, d, name):
        self.name = name
        self.text = read_text(os.path.join(d, f"{name}.status.txt"))
        self.samples = [(i, lines, parse_sample(lines)) for i, lines in status_samples(self.text)]
        self.json = {}
        for k in (0, 1):
            st, _ = read_json(os.path.join(d, f"{name}.status.{k}.json"))
            if isinstance(st, dict):
                self.json[k] = st
        last = self.samples[-1][0] if self.samples else None
        # Sample i is written to file i % 2: the latest JSON is the last text sample's parity.
        order = [last % 2, 1 - last % 2] if last is not None else [1, 0]
        self.json_ordered = [self.json[k] for k in order if k in self.json]

    def all_views(self):
        """Every sample as (label, pool, pool slack, clients): the text samples, then the JSON ones
        (slack: how far the text's rounded figures may be off)."""
        for i, _, s in self.samples:
            yield f"text sample {i}", s["pool"], s["pool_slack"], s["clients"]
        for j, st in enumerate(self.json_ordered):
            yield (("last" if j == 0 else "previous") + " JSON sample", first(st, "pool_bytes", "pool"), 0,
                   json_clients(st))


def full_sample(status, n, pid_rank):
    """The last text sample in which all n ranks show as connected clients; else the one with
    the most. (index, lines, ranks seen, complete)."""
    best = None
    for i, lines, s in status.samples:
        seen = ranks_seen(s["clients"], pid_rank, n)
        if best is None or len(seen) >= len(best[2]):
            best = (i, lines, seen, n > 0 and len(seen) >= n)
    return best


def ranks_seen(clients, pid_rank, n):
    """The ranks among connected clients: by the rank column, else by pid; with neither,
    connected clients counted as ranks 0.. in order."""
    conn = [c for c in clients if c.get("connected", True)]
    seen = {rank_of(c, pid_rank) for c in conn} - {None}
    if not seen and not pid_rank and conn:
        seen = set(range(min(len(conn), n or len(conn))))
    return seen


# ---------------------------------------------------------------- offloadd logs

def daemon_runs(text):
    """offloadd.log split at each 'serving' line (each daemon the plan started)."""
    out = []
    for line in (text or "").splitlines():
        if "serving " in line or not out:
            out.append([])
        out[-1].append(line)
    return [s for s in out if any("serving " in x for x in s)]


def daemon_run_facts(lines):
    """pool bytes, and per pid: client id, rank, bytes back in the pool at disconnect."""
    facts = {"pool": None, "pids": {}}
    for line in lines:
        m = re.search(r"serving .*?\((\d+) pool bytes", line)
        if m:
            facts["pool"] = int(m.group(1))
        m = re.search(r"client (\d+) registered: pid (\d+)", line)
        if m:
            facts["pids"].setdefault(int(m.group(2)), {})["client"] = int(m.group(1))
        m = re.search(r"client (\d+) \(pid (\d+)\): rank (-?\d+)", line)
        if m:
            facts["pids"].setdefault(int(m.group(2)), {})["rank"] = int(m.group(3))
        m = re.search(r"client (\d+) \(pid (\d+)\) (?:disconnected|is gone); (\d+) bytes back", line)
        if m:
            facts["pids"].setdefault(int(m.group(2)), {})["freed"] = int(m.group(3))
    return facts


def log_lines(text, patterns):
    """[(line, count)] of the log lines matching any pattern, first-seen order, deduplicated."""
    seen = {}
    for line in (text or "").splitlines():
        line = line.rstrip()
        if any(p in line for p in patterns):
            seen[line] = seen.get(line, 0) + 1
    return list(seen.items())


# The fair-share section: ddp_share, a host pool smaller than the ranks ask for together; the pool,
# each rank's lease against its fair share, the plans, and the checks.
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
