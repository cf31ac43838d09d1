#!/usr/bin/env python3
"""Does traffic on the host link slow the GPU's compute when the GPU is at its power cap?

    power_link.py [--seconds 8] [--repeat 5] [--duties 0,0.3,1] [--json FILE]

lora's step runs at the H200's power cap (docs/results.md: the software power cap holds
the SM clock down in every busy sample). The shim moves 66.6 GiB a step over the link where the
hand-written baseline moves 72.6 GiB (1309 against 1414 ms of link busy a step). If a copy's
power comes out of the SMs' clock, fewer bytes mean a faster step, and this measures by how much.

A chain of bf16 GEMMs at lora's shapes (2048x6144 against 24 weights of 72 MiB in turn) on one
stream, --seconds long, timed with events; beside it, on a side stream, 72 MiB host-to-device
copies from pinned memory into 24 device buffers, issued so that the link is busy for `duty` of
the chain's time (0: no copies; 0.3 about a lora step's; 1: back to back). The host enqueues
everything ahead of the GPU. Arms run alternately, --repeat times each; nvidia-smi samples the
GPU every 200 ms beside each run (read only), summed up with gpu_state.py.

Per arm: the chain's median time, its time per GEMM, the SM clock and power; against duty 0,
the chain's extra time per millisecond of link busy. Runs on a GPU with PyTorch.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_state  # noqa: E402

D, ROWS, WEIGHTS = 6144, 2048, 24


def timed(fn):
    """GPU time of what fn enqueues on the current stream, in ms (events, then a sync)."""
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e)


def sampler_start(path):
    query = ",".join(gpu_state.COLUMNS)
    try:
        return subprocess.Popen(["nvidia-smi", "-i", str(torch.cuda.current_device()), f"--query-gpu={query}",
                                 "--format=csv,noheader", "-lms", "200"],
                                stdout=open(path, "w"), stderr=subprocess.DEVNULL)
    except OSError:
        return None


def sampler_stop(proc, path):
    if proc is None:
        return None
    proc.terminate()
    proc.wait()
    s = gpu_state.summary(gpu_state.samples(path), busy=90)
    return s if s.get("busy") else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="the chain's length in GPU time")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--duties", default="0,0.3,1", help="comma-separated link duties; 0 must be among them")
    ap.add_argument("--json")
    a = ap.parse_args()
    duties = [float(x) for x in a.duties.split(",")]
    if 0.0 not in duties:
        sys.exit("--duties must include 0 (the chain alone)")

    torch.manual_seed(0)
    x = torch.randn(ROWS, D, device="cuda", dtype=torch.bfloat16)
    w = [torch.randn(D, D, device="cuda", dtype=torch.bfloat16) for _ in range(WEIGHTS)]
    out = torch.empty(ROWS, D, device="cuda", dtype=torch.bfloat16)
    host = [torch.empty(D, D, dtype=torch.bfloat16).pin_memory() for _ in range(4)]
    dst = [torch.empty(D, D, device="cuda", dtype=torch.bfloat16) for _ in range(WEIGHTS)]
    side = torch.cuda.Stream()

    def gemms(n, start=0):
        for i in range(start, start + n):
            torch.matmul(x, w[i % WEIGHTS].t(), out=out)

    def copies(n):
        with torch.cuda.stream(side):
            for i in range(n):
                dst[i % WEIGHTS].copy_(host[i % len(host)], non_blocking=True)

    # Calibration, each alone: a GEMM's and a copy's time.
    gemms(200)
    copies(8)
    torch.cuda.synchronize()
    gemm_ms = statistics.median(timed(lambda: gemms(500)) / 500 for _ in range(3))
    with torch.cuda.stream(side):
        copy_ms = statistics.median(timed(lambda: copies(40)) / 40 for _ in range(3))
    n_gemms = max(1, int(a.seconds * 1000 / gemm_ms))
    print(f"calibration: a GEMM {gemm_ms * 1000:.1f} us, a 72 MiB copy {copy_ms:.3f} ms "
          f"({D * D * 2 / copy_ms / 1e6:.1f} GB/s); {n_gemms} GEMMs a run", flush=True)

    def run(duty, smi):
        n_copies = int(round(duty * n_gemms * gemm_ms / copy_ms))
        every = max(1, n_gemms // n_copies) if n_copies else 0
        torch.cuda.synchronize()
        proc = sampler_start(smi)
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        side.wait_event(s)  # the copies start with the chain
        issued = 0
        step = every or n_gemms
        for i in range(0, n_gemms, step):
            if every and issued < n_copies:
                copies(1)
                issued += 1
            gemms(min(step, n_gemms - i), i)
        e.record()
        link = torch.cuda.Event(enable_timing=True)
        link.record(side)
        torch.cuda.synchronize()
        state = sampler_stop(proc, smi)
        return {"chain_ms": s.elapsed_time(e), "copies": issued,
                "link_ms": issued * copy_ms, "side_end_ms": s.elapsed_time(link) if issued else 0.0,
                "sm_mean": state and state["sm_mean"], "power_mean": state and state["power_mean"]}

    results = {d: [] for d in duties}
    with tempfile.TemporaryDirectory() as tmp:
        run(0.0, os.path.join(tmp, "warm.smi"))  # the clock and the power settle
        for r in range(a.repeat):
            for d in (duties if r % 2 == 0 else duties[::-1]):
                res = run(d, os.path.join(tmp, f"{d}_{r}.smi"))
                results[d].append(res)
                clock = f"{res['sm_mean']:.1f} MHz, {res['power_mean']:.0f} W" if res["sm_mean"] else "no samples"
                print(f"  duty {d:.2f} run {r}: chain {res['chain_ms']:.1f} ms, {res['copies']} copies "
                      f"(link {res['link_ms']:.0f} ms, side stream done at {res['side_end_ms']:.0f} ms); {clock}",
                      flush=True)

    base = statistics.median(x["chain_ms"] for x in results[0.0])
    summary = {"gemm_us": gemm_ms * 1000, "copy_ms": copy_ms, "gemms": n_gemms, "arms": {}}
    print("\n| link duty | copies | chain, median | per GEMM | against no copies | per ms of link busy | SM clock | power |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d in duties:
        runs = results[d]
        med = statistics.median(x["chain_ms"] for x in runs)
        link = statistics.fmean(x["link_ms"] for x in runs)
        per_link = (med - base) / link if link else None
        sm = [x["sm_mean"] for x in runs if x["sm_mean"]]
        pw = [x["power_mean"] for x in runs if x["power_mean"]]
        summary["arms"][str(d)] = {"chain_ms": [x["chain_ms"] for x in runs], "median_ms": med, "link_ms": link,
                                   "extra_per_link_ms": per_link, "sm_mean": statistics.fmean(sm) if sm else None,
                                   "power_mean": statistics.fmean(pw) if pw else None}
        print(f"| {d:.2f} | {runs[0]['copies']} | {med:.1f} ms | {med / n_gemms * 1000:.2f} us | {med - base:+.1f} ms | "
              + (f"{per_link * 1000:+.1f} us" if per_link is not None else "—") + " | "
              + (f"{statistics.fmean(sm):.1f} MHz" if sm else "—") + " | " + (f"{statistics.fmean(pw):.0f} W" if pw else "—") + " |")
    spread = max(x["chain_ms"] for x in results[0.0]) - min(x["chain_ms"] for x in results[0.0])
    print(f"\nRuns without copies spread over {spread:.1f} ms. The shim keeps the link busy 105 ms a lora step "
          f"less than the baseline (docs/results.md): times the per-ms figure at duty 0.3, that is what its fewer bytes "
          f"would be worth a step.")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
