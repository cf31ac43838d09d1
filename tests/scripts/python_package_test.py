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
import json, liboffload
print(json.dumps({
    "version": liboffload.__version__,
    "loaded": liboffload.loaded(),
    "lib_version": liboffload.version(),
    "stats_version": liboffload.stats().get("version"),
    "memory_stats": liboffload.memory_stats(),
    "mark_step": liboffload.mark_step(),
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


def main():
    lib = os.path.abspath(sys.argv[1])
    checks = Checks()
    expect = checks.expect

    got, enable = run(lib)
    expect(f"loaded under the preload: {got}", got["loaded"] is True)
    expect(f"the library's version starts with the package's: {got}",
           got["lib_version"] and (got["version"] == "0+source" or got["lib_version"].startswith(got["version"])))
    expect(f"stats() is the shim's JSON: {got}", got["stats_version"] == 1)
    expect(f"no budget, no memory stats: {got}", got["memory_stats"] == {})
    expect(f"enable() passes under the preload: {enable}", enable == "enabled")

    got, enable = run(None)
    expect(f"not loaded without the preload: {got}", got["loaded"] is False and got["lib_version"] is None)
    expect(f"stats() empty without the preload: {got}", got["stats_version"] is None)
    expect(f"enable() says how to relaunch: {enable}", enable.startswith("refused:") and "offload-run" in enable)

    checks.finish("python package")


if __name__ == "__main__":
    main()
