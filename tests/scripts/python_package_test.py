#!/usr/bin/env python3
"""The liboffload Python package without a GPU: with the shim preloaded it finds the C API and
answers from it; without it, every call says "not loaded" and enable() says how to relaunch.

    python_package_test.py LIBOFFLOAD_SO     (run with PYTHONPATH holding the package)
"""
import os
import subprocess
import sys

from checks import Checks

PROBE = r"""
import json, liboffload, liboffload.profiler
print(json.dumps({
    "version": liboffload.__version__,
    "loaded": liboffload.loaded(),
    "lib_version": liboffload.version(),
    "stats_version": liboffload.stats().get("version"),
    "memory_stats": liboffload.memory_stats(),
    "mark_step": liboffload.mark_step(),
    "copy_streams": sorted(liboffload.profiler.copy_stream_ids()),
}))
try:
    liboffload.enable()
    print("enabled")
except RuntimeError as e:
    print("refused:", e)
"""


def run(preload):
    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if preload:
        env["LD_PRELOAD"] = preload
        env["OFFLOAD_TELEMETRY"] = "off"
        env["OFFLOAD_DAEMON"] = "off"
    p = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise SystemExit(f"the probe failed ({p.returncode}):\n{p.stderr}")
    import json
    lines = p.stdout.splitlines()
    return json.loads(lines[0]), lines[1]


# A torch.profiler (kineto) trace in miniature: copies on stream 7 (taken as the shim's) and 13.
KINETO = {"traceEvents": [
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0, "tid": 7,
     "ts": 1.0, "dur": 2.0, "args": {"stream": 7, "bytes": 4096}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7,
     "ts": 4.0, "dur": 2.0, "args": {"stream": 7, "bytes": 4096}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 13,
     "ts": 5.0, "dur": 1.0, "args": {"stream": 13, "bytes": 64}},
    {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 9.0, "dur": 1.0, "args": {"stream": 7}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 7, "args": {"name": "stream 7"}},
    {"ph": "M", "name": "thread_name", "pid": 0, "tid": 13, "args": {"name": "stream 13"}},
]}


def check_name_copies(checks):
    """liboffload.profiler.name_copies on the miniature trace: only copies on the given streams
    are renamed, by direction, and their row is named."""
    import json
    import tempfile
    import liboffload.profiler as lp
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        with open(path, "w") as f:
            json.dump(KINETO, f)
        n = lp.name_copies(path, streams={7})
        with open(path) as f:
            ev = json.load(f)["traceEvents"]
    names = [e["name"] for e in ev if e["ph"] == "X"]
    rows = {e["tid"]: e["args"]["name"] for e in ev if e["ph"] == "M"}
    checks.expect(f"two copies renamed: {n}", n == 2)
    checks.expect(f"evict and reload by direction: {names}",
                  names[0] == "liboffload evict (Memcpy DtoH (Device -> Pinned))"
                  and names[1] == "liboffload reload (Memcpy HtoD (Pinned -> Device))")
    checks.expect(f"another stream's copy and a kernel keep their names: {names}",
                  names[2] == "Memcpy HtoD (Pageable -> Device)" and names[3] == "gemm")
    checks.expect(f"the shim's row is named: {rows}", rows[7] == "liboffload copies (stream 7)" and rows[13] == "stream 13")


def main():
    lib = os.path.abspath(sys.argv[1])
    checks = Checks()
    expect = checks.expect

    check_name_copies(checks)

    got, enable = run(lib)
    expect(f"loaded under the preload: {got}", got["loaded"] is True)
    expect(f"the library's version starts with the package's: {got}",
           got["lib_version"] and (got["version"] == "0+source" or got["lib_version"].startswith(got["version"])))
    expect(f"stats() is the shim's JSON: {got}", got["stats_version"] == 1)
    expect(f"no budget, no memory stats: {got}", got["memory_stats"] == {})
    expect(f"no GPU, no copy streams: {got}", got["copy_streams"] == [])
    expect(f"enable() passes under the preload: {enable}", enable == "enabled")

    got, enable = run(None)
    expect(f"not loaded without the preload: {got}", got["loaded"] is False and got["lib_version"] is None)
    expect(f"stats() empty without the preload: {got}", got["stats_version"] is None)
    expect(f"enable() says how to relaunch: {enable}", enable.startswith("refused:") and "offload-run" in enable)

    checks.finish("python package")


if __name__ == "__main__":
    main()
