#!/usr/bin/env python3
"""Where a captured training step first differs between two runs: budget.py's graphed_mlp (three
warm-up steps on a side stream, the whole step captured with torch.cuda.graph, then replayed),
its state saved at each stage, so that two runs (plain, and under liboffload with a budget) are
compared tensor by tensor.

  graph_diff.py run OUT.pt        the run; saves digests of the state after the warm-up, after
                                  the capture and after each replay (parameters, gradients,
                                  Adam's state, the loss: two checksums of the bits and a sample
                                  of elements) and each tensor's address modulo 2 MiB
  graph_diff.py diff A.pt B.pt    the first stage and tensors that differ, bit for bit
"""
import os
import sys

import torch
import torch.nn as nn


def digest(t):
    """Two checksums of the tensor's bits (computed on the GPU) and every 4099th element."""
    t = t.detach().contiguous()
    bits = t.reshape(-1).view(torch.int32).to(torch.int64)
    w = torch.arange(bits.numel(), device=t.device, dtype=torch.int64) % 65521 + 1
    return (bits.sum().item(), (bits * w).sum().item(), t.reshape(-1)[::4099].float().cpu().clone())


def run(out, replays=3, scale="small"):
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    # PAD: bytes allocated (and kept) before the model, which moves every later address.
    pad = torch.empty(int(os.environ.get("PAD", "0")), dtype=torch.uint8, device="cuda")
    torch.manual_seed(0)
    d, depth, batch = {"small": (2048, 8, 4096), "large": (4096, 12, 16384)}[scale]
    dev = "cuda"
    model = nn.Sequential(*[nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.LayerNorm(d))
                            for _ in range(depth)]).to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)
    static_x = torch.zeros(batch, d, device=dev)
    gen = torch.Generator(device=dev)

    def g(k):
        gen.manual_seed(k)
        return gen

    def whole_step():
        opt.zero_grad(set_to_none=False)
        loss = model(static_x).float().pow(2).mean()
        loss.backward()
        opt.step()
        return loss

    stages = {}

    def snap(name, loss):
        torch.cuda.synchronize()
        st = {"loss": digest(loss)}
        for i, p in enumerate(model.parameters()):
            st[f"p{i}"] = digest(p)
            st[f"g{i}"] = digest(p.grad) if p.grad is not None else None
            s = opt.state.get(p, {})
            for k in ("exp_avg", "exp_avg_sq", "step"):
                if k in s:
                    st[f"{k}{i}"] = digest(s[k])
        addr = {f"p{i}": p.data_ptr() % (2 << 20) for i, p in enumerate(model.parameters())}
        addr.update({f"g{i}": p.grad.data_ptr() % (2 << 20) for i, p in enumerate(model.parameters())
                     if p.grad is not None})
        stages[name] = (st, addr)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for k in range(3):
            static_x.copy_(torch.randn(batch, d, generator=g(10_000 + k), device=dev))
            loss = whole_step().detach()  # the autograd graph must not outlive its step
    torch.cuda.current_stream().wait_stream(side)
    snap("warmup", loss)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_loss = whole_step()
    snap("captured", loss)
    for k in range(replays):
        static_x.copy_(torch.randn(batch, d, generator=g(k), device=dev))
        graph.replay()
        snap(f"replay{k + 1}", static_loss)
    del pad
    torch.save(stages, out)
    print(f"saved {len(stages)} stages to {out}")


def same(a, b):
    if a is None or b is None:
        return a is None and b is None
    return a[0] == b[0] and a[1] == b[1]


def diff(pa, pb):
    a, b = torch.load(pa), torch.load(pb)
    first = None
    for stage in a:
        sa, aa = a[stage]
        sb, ab = b[stage]
        bad = [k for k in sa if not same(sa[k], sb.get(k))]
        print(f"{stage}: {len(bad)} of {len(sa)} tensors differ" + (f": {', '.join(bad[:24])}" if bad else ""))
        for k in bad[:6]:
            if sa[k] is not None and sb.get(k) is not None:
                x, y = sa[k][2], sb[k][2]
                n = (x != y).sum().item()
                print(f"  {k}: {n} of {x.numel()} sampled elements differ, largest difference {(x - y).abs().max().item():.3g}")
        if bad and first is None:
            first = stage
        if stage == "warmup":
            print("  addresses mod 2 MiB (a / b):", {k: (aa[k], ab.get(k)) for k in list(aa)[:8]})
    print("first stage that differs:", first or "none")
    return 0 if first is None else 1


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], scale=os.environ.get("SCALE", "small"))
    else:
        sys.exit(diff(sys.argv[2], sys.argv[3]))
