#!/usr/bin/env python3
"""The PCIe link as the planner models it: pinned host<->device copies of 1 GiB, each way
alone and both at once (on two streams), best of 5. Prints one JSON object (GB/s).

  link.py            the current GPU
  link.py --gpus N   GPUs 0..N-1: each alone, then all at once (each way, and both ways),
                     the sums that offloadd's --node-link takes (H2D,D2H,BOTH)
"""
import argparse
import json
import time

import torch

GiB = 1 << 30


def timed(fn, devices, reps=5):
    """Best wall time of fn() over reps, all devices synchronised before and after."""
    best = float("inf")
    for _ in range(reps):
        for d in devices:
            torch.cuda.synchronize(d)
        t0 = time.perf_counter()
        fn()
        for d in devices:
            torch.cuda.synchronize(d)
        best = min(best, time.perf_counter() - t0)
    return best


class Gpu:
    """Buffers and two copy streams on one device; host buffers pinned for it."""

    def __init__(self, device, n):
        self.device = device
        with torch.cuda.device(device):
            self.host_a = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            self.host_b = torch.empty(n, dtype=torch.uint8, pin_memory=True)
            self.dev_a = torch.empty(n, dtype=torch.uint8, device=device)
            self.dev_b = torch.empty(n, dtype=torch.uint8, device=device)
            self.s1, self.s2 = torch.cuda.Stream(device), torch.cuda.Stream(device)

    def h2d(self):
        with torch.cuda.stream(self.s1):
            self.dev_a.copy_(self.host_a, non_blocking=True)

    def d2h(self):
        with torch.cuda.stream(self.s2):
            self.host_b.copy_(self.dev_b, non_blocking=True)

    def both(self):
        self.h2d()
        self.d2h()


def single(g, n):
    """One GPU alone: each way, and both ways at once (sum)."""
    dev = [g.device]
    return {
        "h2d_gbps": round(n / timed(g.h2d, dev) / 1e9, 2),
        "d2h_gbps": round(n / timed(g.d2h, dev) / 1e9, 2),
        "both_gbps_sum": round(2 * n / timed(g.both, dev) / 1e9, 2),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=0, help="measure GPUs 0..N-1 alone and all at once")
    args = p.parse_args()
    n = GiB
    if args.gpus <= 0:
        g = Gpu(torch.cuda.current_device(), n)
        print(json.dumps({"bytes": n, **single(g, n), "gpu": torch.cuda.get_device_name()}))
        return
    if args.gpus > torch.cuda.device_count():
        raise SystemExit(f"link.py: --gpus {args.gpus} but {torch.cuda.device_count()} visible")
    gpus = [Gpu(d, n) for d in range(args.gpus)]
    devices = [g.device for g in gpus]
    alone = [single(g, n) for g in gpus]
    k = len(gpus)
    together = {
        "h2d_gbps_sum": round(k * n / timed(lambda: [g.h2d() for g in gpus], devices) / 1e9, 2),
        "d2h_gbps_sum": round(k * n / timed(lambda: [g.d2h() for g in gpus], devices) / 1e9, 2),
        "both_gbps_sum": round(2 * k * n / timed(lambda: [g.both() for g in gpus], devices) / 1e9, 2),
    }
    print(json.dumps({
        "bytes": n,
        "gpus": k,
        "alone": alone,
        "together": together,
        "node_link": f"{together['h2d_gbps_sum']},{together['d2h_gbps_sum']},{together['both_gbps_sum']}",
        "gpu": torch.cuda.get_device_name(0),
    }))


if __name__ == "__main__":
    main()
