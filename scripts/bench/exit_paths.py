"""Ends a process that used CUDA in one of the ways a training script ends, for the exit check
in scripts/gpu/budget.sh: `python3 exit_paths.py MODE` with MODE one of
  oom        an allocation past the device budget (torch.OutOfMemoryError, uncaught)
  raise      a Python exception after some training work
  sysexit    sys.exit(3) after some training work
  normal     returns
  child      a forked child that ends with os._exit(0) while the parent waits
The caller checks the exit status and that stderr holds no 'terminate called'."""
import os
import sys

import torch

mode = sys.argv[1]
x = torch.randn(4096, 4096, device="cuda", requires_grad=True)
(x @ x).sum().backward()
torch.cuda.synchronize()
if mode == "oom":
    torch.empty(1 << 40, dtype=torch.uint8, device="cuda")
elif mode == "raise":
    raise ValueError("a failing training script")
elif mode == "sysexit":
    sys.exit(3)
elif mode == "child":
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
