"""Our copies by name in a torch.profiler trace.

torch.profiler records every copy the GPU runs, the shim's own included, but names them all
"Memcpy DtoH (Device -> Pinned)" and the like. The shim copies only on streams of its own;
name_copies() renames the copy events on those streams in an exported Chrome trace to
"liboffload evict ..." (device to host) and "liboffload reload ..." (host to device), and
names their stream rows "liboffload copies". The streams are matched by CUPTI's stream id,
which is what the profiler's trace calls "stream".

    with torch.profiler.profile(activities=[...]) as prof:
        train_step()
    liboffload.profiler.export_chrome_trace(prof, "trace.json")
"""

import json

from . import stats

__all__ = ["copy_stream_ids", "name_copies", "export_chrome_trace"]


def copy_stream_ids():
    """CUPTI's ids of the streams the preloaded shim copies on (empty when not preloaded)."""
    return {s["cupti_id"] for s in stats().get("copy_streams", []) if s.get("cupti_id", -1) >= 0}


def _renamed(name):
    if "DtoH" in name:
        return "liboffload evict (" + name + ")"
    if "HtoD" in name:
        return "liboffload reload (" + name + ")"
    return "liboffload copy (" + name + ")"


def name_copies(path, out=None, streams=None):
    """Renames the shim's copies in the Chrome trace at `path` (written to `out`, by default in
    place). `streams`: the CUPTI stream ids to treat as the shim's (by default, the preloaded
    shim's). Returns how many copy events were renamed."""
    ids = copy_stream_ids() if streams is None else set(streams)
    with open(path) as f:
        trace = json.load(f)
    events = trace.get("traceEvents", []) if isinstance(trace, dict) else trace
    renamed = 0
    rows = set()
    for e in events:
        args = e.get("args") or {}
        if e.get("ph") == "X" and e.get("cat") == "gpu_memcpy" and args.get("stream") in ids:
            e["name"] = _renamed(e.get("name", ""))
            rows.add((e.get("pid"), e.get("tid")))
            renamed += 1
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "thread_name" and (e.get("pid"), e.get("tid")) in rows:
            e.setdefault("args", {})["name"] = "liboffload copies (stream %s)" % e.get("tid")
    with open(out or path, "w") as f:
        json.dump(trace, f)
    return renamed


def export_chrome_trace(prof, path):
    """prof.export_chrome_trace(path), then name_copies(path). Returns the renamed count."""
    prof.export_chrome_trace(path)
    return name_copies(path)
