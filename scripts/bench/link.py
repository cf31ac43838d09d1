#!/usr/bin/env python3
"""The PCIe link as the planner models it: pinned host<->device copies of 1 GiB, each way
alone and both at once (on two streams), best of 5. Prints one JSON object (GB/s)."""
import json
import torch

GiB = 1 << 30


def timed(fn, reps=5):
    best = float("inf")
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def main():
    n = GiB
    host_a = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    host_b = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev_a = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev_b = torch.empty(n, dtype=torch.uint8, device="cuda")
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    h2d = timed(lambda: dev_a.copy_(host_a, non_blocking=True))
    d2h = timed(lambda: host_b.copy_(dev_b, non_blocking=True))

    # Both at once: each on its own stream, the time until both are done; and each one's own
    # time while the other runs (events on its stream).
    def both():
        cur = torch.cuda.current_stream()
        s1.wait_stream(cur)
        s2.wait_stream(cur)
        with torch.cuda.stream(s1):
            dev_a.copy_(host_a, non_blocking=True)
        with torch.cuda.stream(s2):
            host_b.copy_(dev_b, non_blocking=True)
        cur.wait_stream(s1)
        cur.wait_stream(s2)
    duplex = timed(both)
    print(json.dumps({
        "bytes": n,
        "h2d_gbps": round(n / h2d / 1e9, 2),
        "d2h_gbps": round(n / d2h / 1e9, 2),
        "both_gbps_sum": round(2 * n / duplex / 1e9, 2),
        "gpu": torch.cuda.get_device_name(),
    }))


if __name__ == "__main__":
    main()
