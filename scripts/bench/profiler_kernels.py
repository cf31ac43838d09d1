#!/usr/bin/env python3
"""How many CUDA kernels torch.profiler records in one training step of a small transformer-like
model, as JSON: {"kernels": N, "cuda_events": M, "shim": loaded}. Run it with and without the shim
preloaded (scripts/gpu/profiler_check.sh): the counts must be equal.
"""
import json
import sys

import torch
from torch.profiler import ProfilerActivity, profile


def main():
    torch.manual_seed(0)
    d = 1024
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(),
                                                      torch.nn.Linear(4 * d, d), torch.nn.LayerNorm(d))
                                  for _ in range(4)]).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(32, 256, d, device="cuda")

    def step():
        loss = model(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(2):  # warm up: lazy modules, cuBLAS handles, the optimizer's state
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    events = list(prof.events())
    cuda = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
    kernels = [e for e in cuda if "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]
    try:
        import ctypes
        shim = hasattr(ctypes.CDLL(None), "offload_version")
    except OSError:
        shim = False
    json.dump({"kernels": len(kernels), "cuda_events": len(cuda), "shim": shim}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
