"""What streaming costs the kernels it runs beside, measured on the GPU (one process, one context).

Weight streaming adds, per streamed window: a physical mapping made and one removed
(cuMemMap + cuMemSetAccess, cuMemUnmap) while kernels run, an event recorded on the compute
stream (the copy out waits for it), a cross-stream wait before the first use of the reloaded
weight, and a copy each way over PCIe. Each is measured here against a chain of kernels alone:

- gemm: bf16 matmuls of the lora workload's shape (16384 x 6144 by 6144 x 6144), the kernels
  that carry its step; add: an elementwise add of two 256 MiB bf16 tensors (memory-bound).
- vmm: a second thread maps, opens and unmaps a 256 MiB handle at a reserved range, as fast as
  it can, while the chain runs; the chain's extra time per map/unmap pair is the cost.
- sync: before each kernel, an event recorded on an idle side stream and waited for on the
  compute stream (what a reload's wait is once its copy is done), or an event recorded on the
  compute stream (what an eviction adds).
- dma: pinned copies in flight both ways (256 MiB at a time, two side streams) for the whole
  chain; the link busy, as it is at most while streaming.

Prints one JSON object (ms per kernel in each setting, and the derived costs).
"""

import ctypes
import json
import sys
import threading
import time

import torch

cu = ctypes.CDLL("libcuda.so.1")


class MemLocation(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", MemLocation),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]


class AccessDesc(ctypes.Structure):
    _fields_ = [("location", MemLocation), ("flags", ctypes.c_int)]


def check(rc, what):
    if rc != 0:
        raise RuntimeError(f"{what}: CUDA driver error {rc}")


class Churn:
    """Maps and unmaps one physical handle at a reserved range, in a thread, until stopped."""

    def __init__(self, nbytes, device):
        self.ctx = ctypes.c_void_p()
        check(cu.cuCtxGetCurrent(ctypes.byref(self.ctx)), "cuCtxGetCurrent")
        self.prop = AllocProp()
        self.prop.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location = MemLocation(1, device)  # CU_MEM_LOCATION_TYPE_DEVICE
        gran = ctypes.c_size_t()
        check(cu.cuMemGetAllocationGranularity(ctypes.byref(gran), ctypes.byref(self.prop), 0), "granularity")
        self.bytes = (nbytes + gran.value - 1) // gran.value * gran.value
        self.handle = ctypes.c_ulonglong()
        check(cu.cuMemCreate(ctypes.byref(self.handle), ctypes.c_size_t(self.bytes), ctypes.byref(self.prop),
                             ctypes.c_ulonglong(0)), "cuMemCreate")
        self.va = ctypes.c_ulonglong()
        check(cu.cuMemAddressReserve(ctypes.byref(self.va), ctypes.c_size_t(self.bytes), ctypes.c_size_t(0),
                                     ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
        self.access = AccessDesc(MemLocation(1, device), 3)  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.pairs = 0
        self.stop = threading.Event()
        self.thread = None

    def _run(self, rate):
        check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        period = 1.0 / rate if rate else 0.0
        t_next = time.perf_counter()
        while not self.stop.is_set():
            check(cu.cuMemMap(self.va, ctypes.c_size_t(self.bytes), ctypes.c_size_t(0), self.handle,
                              ctypes.c_ulonglong(0)), "cuMemMap")
            check(cu.cuMemSetAccess(self.va, ctypes.c_size_t(self.bytes), ctypes.byref(self.access),
                                    ctypes.c_size_t(1)), "cuMemSetAccess")
            check(cu.cuMemUnmap(self.va, ctypes.c_size_t(self.bytes)), "cuMemUnmap")
            self.pairs += 1
            if period:
                t_next += period
                delay = t_next - time.perf_counter()
                if delay > 0:
                    time.sleep(delay)

    def start(self, rate=0):
        self.pairs = 0
        self.stop.clear()
        self.thread = threading.Thread(target=self._run, args=(rate,), daemon=True)
        self.thread.start()

    def finish(self):
        self.stop.set()
        self.thread.join()
        return self.pairs


def chain(kernel, n, before=None):
    """Runs `kernel` n times on the current stream (after `before(i)` each time, if given);
    returns GPU ms per kernel, from events around the whole chain."""
    torch.cuda.synchronize()
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0.record()
    for i in range(n):
        if before:
            before(i)
        kernel()
    t1.record()
    t1.synchronize()
    return t0.elapsed_time(t1) / n


def main():
    torch.manual_seed(0)
    dev = torch.cuda.current_device()
    a = torch.randn(16384, 6144, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(6144, 6144, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(16384, 6144, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(128 << 20, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(128 << 20, device="cuda", dtype=torch.bfloat16)
    z = torch.empty_like(x)
    gemm = lambda: torch.matmul(a, w, out=out)  # noqa: E731
    add = lambda: torch.add(x, y, out=z)  # noqa: E731
    n_gemm, n_add = int(sys.argv[1]) if len(sys.argv) > 1 else 400, 400
    for _ in range(20):
        gemm()
        add()
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "n_gemm": n_gemm, "n_add": n_add}

    def both(tag, before=None):
        g = min(chain(gemm, n_gemm, before) for _ in range(3))
        e = min(chain(add, n_add, before) for _ in range(3))
        res[tag] = {"gemm_ms": round(g, 5), "add_ms": round(e, 5)}
        print(f"[overheads] {tag}: gemm {g:.4f} ms, add {e:.4f} ms", file=sys.stderr, flush=True)
        return g, e

    # The GEMM chain's time drifts by a few percent over a run (clocks under sustained load):
    # each setting is compared with a run alone measured just before it.
    alone_runs = []

    def alone():
        g, e = both(f"alone_{len(alone_runs)}")
        alone_runs.append((g, e))
        return g, e

    base_g, base_e = alone()

    # Sync commands, once per kernel.
    side = torch.cuda.Stream()
    evs = [torch.cuda.Event() for _ in range(8)]

    def wait_side(i):
        e = evs[i % 8]
        e.record(side)
        torch.cuda.current_stream().wait_event(e)

    def record_main(i):
        evs[i % 8].record()

    base_g, base_e = alone()
    g, e = both("wait_per_kernel", wait_side)
    res["wait_us"] = {"gemm": round((g - base_g) * 1e3, 2), "add": round((e - base_e) * 1e3, 2)}
    base_g, base_e = alone()
    g, e = both("record_per_kernel", record_main)
    res["record_us"] = {"gemm": round((g - base_g) * 1e3, 2), "add": round((e - base_e) * 1e3, 2)}

    # Map/unmap churn in another thread, as fast as it goes, then at 100 pairs a second.
    churn = Churn(256 << 20, dev)
    for rate in (0, 100):
        tag = "vmm_free" if rate == 0 else f"vmm_{rate}_per_s"
        base_g, base_e = alone()
        churn.start(rate)
        t0 = time.perf_counter()
        g = min(chain(gemm, n_gemm) for _ in range(3))
        e = min(chain(add, n_add) for _ in range(3))
        wall = time.perf_counter() - t0
        pairs = churn.finish()
        per_s = pairs / wall
        res[tag] = {"gemm_ms": round(g, 5), "add_ms": round(e, 5), "pairs_per_s": round(per_s, 1)}
        # Extra GPU time per map/unmap pair: the chain's slowdown over the pairs made meanwhile.
        res[tag]["us_per_pair_gemm"] = round((g - base_g) / g * 1e6 / per_s, 2) if per_s else None
        res[tag]["us_per_pair_add"] = round((e - base_e) / e * 1e6 / per_s, 2) if per_s else None
        print(f"[overheads] {tag}: gemm {g:.4f} ms, add {e:.4f} ms, {per_s:.0f} pairs/s", file=sys.stderr, flush=True)

    # The link busy both ways for the whole chain.
    hbuf_in = torch.empty(128 << 20, dtype=torch.bfloat16, pin_memory=True)
    hbuf_out = torch.empty(128 << 20, dtype=torch.bfloat16, pin_memory=True)
    dbuf_in = torch.empty(128 << 20, device="cuda", dtype=torch.bfloat16)
    s_in, s_out = torch.cuda.Stream(), torch.cuda.Stream()
    for tag, ways in (("dma_h2d", ("in",)), ("dma_both", ("in", "out"))):
        base_g, base_e = alone()
        stop = threading.Event()
        moved = [0]

        def pump():
            while not stop.is_set():
                if "in" in ways:
                    with torch.cuda.stream(s_in):
                        dbuf_in.copy_(hbuf_in, non_blocking=True)
                if "out" in ways:
                    with torch.cuda.stream(s_out):
                        hbuf_out.copy_(x, non_blocking=True)
                moved[0] += 1
                (s_in if "in" in ways else s_out).synchronize()
                if "out" in ways:
                    s_out.synchronize()

        th = threading.Thread(target=pump, daemon=True)
        th.start()
        time.sleep(0.2)
        g = min(chain(gemm, n_gemm) for _ in range(3))
        e = min(chain(add, n_add) for _ in range(3))
        stop.set()
        th.join()
        res[tag] = {"gemm_ms": round(g, 5), "add_ms": round(e, 5),
                    "gemm_slowdown_pct": round((g / base_g - 1) * 100, 3), "add_slowdown_pct": round((e / base_e - 1) * 100, 3)}
        print(f"[overheads] {tag}: gemm {g:.4f} ms, add {e:.4f} ms", file=sys.stderr, flush=True)
    gs = [g for g, _ in alone_runs]
    res["alone_gemm_spread_pct"] = round((max(gs) / min(gs) - 1) * 100, 3)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
