#!/usr/bin/env python3
"""What the shim's weight streaming costs the GPU per operation, apart from the model.

    sync_cost.py [--launches N] [--json FILE]

A chain of kernels on one stream (a bf16 GEMM and a small elementwise kernel, in turn: lora's
step is big GEMMs between small kernels), timed with events, the host far ahead. Each variant
adds one thing the executor does per streamed weight and compares the chain's GPU time:

- `wait_done`: the chain waits, every 8th launch, on an event of a side stream that completed
  long before (the executor's wait for a reload that has landed: one per window on lora).
- `wait_copy`: the same, the event recorded after a 72 MiB host-to-device copy on the side
  stream issued 8 launches before the wait: a reload issued too late for its use, the GPU
  waiting for the copy (a check that the measurement sees a stall).
- `wait_copy_landed`: copies of 2 MiB (the link keeps up), each waited for 16 waits (128
  launches) after its issue, when it has landed: a reload issued well ahead of its use.
- `copy_only`: 72 MiB host-to-device copies on the side stream every 128 launches, no wait:
  whether a copy itself (its start, the link busy) costs the kernels anything;
  `copy_wait_landed` the same, each waited for two copies later; `copy_only_registered` from
  shared memory registered with the driver, as the shim's host pool is, instead of pinned.
- `vmm_churn`: a host thread maps, grants access to and unmaps a 72 MiB handle (lora's unit)
  in a range of its own, as the executor does per piece, while the chain runs: whether the
  driver's page-table updates slow the kernels.
- `record`: an event recorded on the chain's stream every 16 launches (the executor's record of a
  leaving weight's last use); `record_side_wait` the same, a side stream waiting for each.
- `pipeline`: the executor's whole chain per window, every 32 launches: an event on the chain's
  stream (the leaving weight's last use), a second stream waiting for it and recording its own
  (the eviction), a third waiting for that, copying 2 MiB and recording (the reload), and the
  chain waiting for that 16 launches later (the use). As the executor orders a reload after the
  memory's last owner.
- `vmm_first_use`: every 16th GEMM reads its weight from a range mapped (and granted access)
  just before the chain, never touched by the GPU before: what a reloaded weight's first use
  costs for its fresh mapping alone. Alias ranges of one 72 MiB handle.
- `vmm_mapped_once`: the same reads from ranges mapped once before every run and never
  remapped (read in the run before): `vmm_first_use` less this is a new mapping's cost to its
  first reader. `--fresh-every` sets how often (16 GEMMs; 4 resolves ~10 µs at `--big`).
- `vmm_use_remap`: the same, and a host thread, as each such GEMM completes (its event), unmaps
  its range and maps it again, as the executor unmaps a leaving weight right after its last
  use and maps the memory elsewhere: the unmap of a range the GPU has just read, beside the
  running chain. Its cost per range less `vmm_first_use`'s is the unmap and map of a used range.

- `pool_ops`: before each launch, a stream-ordered allocation from the device's memory pool
  (cuMemAllocAsync, 2, 48 or 192 MiB in turn) and the free of the one made two launches before
  (cuMemFreeAsync), both on the chain's stream, the pool keeping what it reserved: what PyTorch's
  `backend:cudaMallocAsync` does around every kernel (lora: about 0.9 allocations and 0.9 frees
  a launch), which the shim needs and its native allocator does not. Per pair.

Per variant: the chain's median time against the plain chain's, run alternately (--repeat
times each), and the cost per operation. The chain queues behind a sleeping kernel, so the
host is ahead of the GPU as in a training step. Runs on a GPU with PyTorch; libcuda through ctypes.
"""
import argparse
import ctypes
import json
import mmap
import statistics
import threading
import time

import torch


def kernel(i, a, b, c):
    """The chain's launch i: a GEMM against the next weight (even i), else an add."""
    if i % 2 == 0:
        torch.mm(a, b[(i // 2) % len(b)] if isinstance(b, list) else b, out=c)
    else:
        c.add_(1.0)


def chain(n, a, b, c, side=None, every=0, mode="", copy_src=None, copy_dst=None, ahead=16):
    s = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    events = []
    if mode == "wait_done":
        with torch.cuda.stream(side):
            e = torch.cuda.Event()
            e.record(side)
        torch.cuda.synchronize()  # landed long before
    # The host far ahead, as in a training step: the chain queues behind a sleeping kernel.
    torch.cuda._sleep(int(2e8))
    start.record(s)
    waits = 0
    for i in range(n):
        if every and i % every == 0 and i:
            if mode == "wait_done":
                s.wait_event(e)
                waits += 1
            elif mode == "wait_copy" or (mode == "wait_copy_landed" and len(events) > ahead):
                s.wait_event(events.pop(0))
                waits += 1
        if mode in ("copy_only", "copy_wait_landed") and i % every == 0 and i:
            if mode == "copy_wait_landed" and len(events) > 2:
                s.wait_event(events.pop(0))
            with torch.cuda.stream(side):
                copy_dst.copy_(copy_src, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(side)
                events.append(ev)
            waits += 1
        if mode in ("wait_copy", "wait_copy_landed") and every and i % every == 0:
            with torch.cuda.stream(side):
                copy_dst.copy_(copy_src, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(side)
                events.append(ev)
        kernel(i, a, b, c)
    end.record(s)
    torch.cuda.synchronize()
    return start.elapsed_time(end), waits


class Vmm:
    """cuMemCreate / cuMemAddressReserve / cuMemMap / cuMemSetAccess / cuMemUnmap via ctypes."""

    class Location(ctypes.Structure):
        _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]

    class AllocFlags(ctypes.Structure):
        _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                    ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]

    class Prop(ctypes.Structure):
        pass

    class Access(ctypes.Structure):
        pass

    Prop._fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", Location),
                     ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", AllocFlags)]
    Access._fields_ = [("location", Location), ("flags", ctypes.c_int)]

    def __init__(self, device, size):
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.size = size
        self.prop = Vmm.Prop()
        self.prop.type = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
        self.prop.location.type = 1  # CU_MEM_LOCATION_TYPE_DEVICE
        self.prop.location.id = device
        self.access = Vmm.Access()
        self.access.location.type = 1
        self.access.location.id = device
        self.access.flags = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.handle = ctypes.c_ulonglong()
        self.check(self.cu.cuMemCreate(ctypes.byref(self.handle), ctypes.c_size_t(size), ctypes.byref(self.prop),
                                       ctypes.c_ulonglong(0)), "cuMemCreate")
        self.va = ctypes.c_ulonglong()
        self.check(self.cu.cuMemAddressReserve(ctypes.byref(self.va), ctypes.c_size_t(size), ctypes.c_size_t(0),
                                               ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")

    @staticmethod
    def check(rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: CUresult {rc}")

    def cycle(self):
        self.check(self.cu.cuMemMap(self.va, ctypes.c_size_t(self.size), ctypes.c_size_t(0), self.handle,
                                    ctypes.c_ulonglong(0)), "cuMemMap")
        self.check(self.cu.cuMemSetAccess(self.va, ctypes.c_size_t(self.size), ctypes.byref(self.access),
                                          ctypes.c_size_t(1)), "cuMemSetAccess")
        self.check(self.cu.cuMemUnmap(self.va, ctypes.c_size_t(self.size)), "cuMemUnmap")


class Aliases:
    """`count` address ranges of their own, each mapped to the same physical handle on demand."""

    def __init__(self, vmm, count):
        self.vmm, self.count = vmm, count
        self.vas = []
        for _ in range(count):
            va = ctypes.c_ulonglong()
            vmm.check(vmm.cu.cuMemAddressReserve(ctypes.byref(va), ctypes.c_size_t(vmm.size), ctypes.c_size_t(0),
                                                 ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
            self.vas.append(va)

    def map(self, i):
        v = self.vmm
        v.check(v.cu.cuMemMap(self.vas[i], ctypes.c_size_t(v.size), ctypes.c_size_t(0), v.handle,
                              ctypes.c_ulonglong(0)), "cuMemMap")
        v.check(v.cu.cuMemSetAccess(self.vas[i], ctypes.c_size_t(v.size), ctypes.byref(v.access),
                                    ctypes.c_size_t(1)), "cuMemSetAccess")

    def unmap(self, i):
        self.vmm.check(self.vmm.cu.cuMemUnmap(self.vas[i], ctypes.c_size_t(self.vmm.size)), "cuMemUnmap")

    def tensor(self, i, shape):
        class Iface:  # a bf16 view of the range, as float16 (same width) for the interface
            __cuda_array_interface__ = {"shape": tuple(shape), "typestr": "<f2", "data": (self.vas[i].value, False),
                                        "version": 3}
        return torch.as_tensor(Iface(), device="cuda").view(torch.bfloat16)


def event_chain(n, a, b, c, mode, side, third, copy_src, copy_dst):
    """The chain with the executor's events: see `record`, `record_side_wait` and `pipeline`."""
    s = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2e8))
    start.record(s)
    ops, pending = 0, []
    for i in range(n):
        every = 32 if mode == "pipeline" else 16
        if i and i % every == 0:
            last = torch.cuda.Event()
            last.record(s)
            ops += 1
            if mode == "record_side_wait":
                side.wait_event(last)
            elif mode == "pipeline":
                side.wait_event(last)
                gone = torch.cuda.Event()
                gone.record(side)
                third.wait_event(gone)
                with torch.cuda.stream(third):
                    copy_dst.copy_(copy_src, non_blocking=True)
                landed = torch.cuda.Event()
                landed.record(third)
                pending.append((i + 16, landed))
        while pending and pending[0][0] <= i:
            s.wait_event(pending.pop(0)[1])
        kernel(i, a, b, c)
    end.record(s)
    torch.cuda.synchronize()
    return start.elapsed_time(end), ops


def fresh_chain(n, a, b, c, al, every, remap, kept=False):
    """The chain with every `every`-th GEMM reading a freshly mapped alias range instead of its
    weight; with `remap`, each such range unmapped and mapped again as soon as its GEMM is done;
    `kept`: the ranges were mapped once, before every run (read in each run, never remapped)."""
    bw = b if isinstance(b, list) else [b]
    k = (n // 2 + every - 1) // every
    if not kept:
        for i in range(k):
            al.map(i)
    torch.cuda.synchronize()
    fresh = [al.tensor(i, bw[0].shape) for i in range(k)]
    s = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int(2e8))
    start.record(s)
    done = []
    for i in range(n):
        if i % 2 == 0:
            j = i // 2
            torch.mm(a, fresh[j // every] if j % every == 0 else bw[j % len(bw)], out=c)
            if remap and j % every == 0:
                e = torch.cuda.Event()
                e.record(s)
                done.append((j // every, e))
        else:
            c.add_(1.0)
    end.record(s)

    def body():
        for idx, e in done:
            e.synchronize()
            al.unmap(idx)
            al.map(idx)

    th = threading.Thread(target=body)
    th.start()
    th.join()
    torch.cuda.synchronize()
    del fresh
    if not kept:
        for i in range(k):
            al.unmap(i)
    return start.elapsed_time(end), k


class PoolOps:
    """cuMemAllocAsync / cuMemFreeAsync on the device's default memory pool, which keeps what it
    reserved (release threshold at its maximum, as PyTorch sets it for its cudaMallocAsync backend)."""

    def __init__(self, device):
        self.cu = ctypes.CDLL("libcuda.so.1")
        dev, pool = ctypes.c_int(), ctypes.c_void_p()
        Vmm.check(self.cu.cuDeviceGet(ctypes.byref(dev), ctypes.c_int(device)), "cuDeviceGet")
        Vmm.check(self.cu.cuDeviceGetDefaultMemPool(ctypes.byref(pool), dev), "cuDeviceGetDefaultMemPool")
        keep = ctypes.c_uint64(2**64 - 1)
        Vmm.check(self.cu.cuMemPoolSetAttribute(pool, ctypes.c_int(4), ctypes.byref(keep)),  # RELEASE_THRESHOLD
                  "cuMemPoolSetAttribute")

    def alloc(self, size, stream):
        p = ctypes.c_ulonglong()
        Vmm.check(self.cu.cuMemAllocAsync(ctypes.byref(p), ctypes.c_size_t(size), ctypes.c_void_p(stream)), "cuMemAllocAsync")
        return p

    def free(self, p, stream):
        Vmm.check(self.cu.cuMemFreeAsync(p, ctypes.c_void_p(stream)), "cuMemFreeAsync")


def pool_chain(n, a, b, c, ops):
    """The chain with a stream-ordered allocation before each launch and the free of the one
    made two launches before (PoolOps)."""
    s = torch.cuda.current_stream()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    sizes = (2 << 20, 48 << 20, 192 << 20)
    live = []
    torch.cuda._sleep(int(2e8))
    start.record(s)
    for i in range(n):
        live.append(ops.alloc(sizes[i % 3], s.cuda_stream))
        if len(live) > 2:
            ops.free(live.pop(0), s.cuda_stream)
        kernel(i, a, b, c)
    end.record(s)
    for p in live:
        ops.free(p, s.cuda_stream)
    torch.cuda.synchronize()
    return start.elapsed_time(end), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launches", type=int, default=4000)
    ap.add_argument("--size", type=int, default=2048, help="GEMM side (bf16)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--fresh-every", type=int, default=16, help="vmm_* variants: every how many GEMMs read an alias range")
    ap.add_argument("--big", action="store_true", help="lora's shapes: d=6144, 24 weights of 72 MiB in turn")
    ap.add_argument("--only", help="comma-separated variants to run")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.cuda.init()
    dev = torch.cuda.current_device()
    n = args.launches
    if args.big:
        # lora's shapes: 2048 tokens of d=6144 against 24 weights of 72 MiB in turn, 1.7 GiB
        # touched over and over, as a step touches gigabytes (the TLBs' reach matters).
        a = torch.randn(2048, 6144, device="cuda", dtype=torch.bfloat16)
        b = [torch.randn(6144, 6144, device="cuda", dtype=torch.bfloat16) for _ in range(24)]
        c = torch.empty(2048, 6144, device="cuda", dtype=torch.bfloat16)
    else:
        a = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(args.size, args.size, device="cuda", dtype=torch.bfloat16)
    side, third = torch.cuda.Stream(), torch.cuda.Stream()
    unit = 72 << 20
    src = torch.empty(unit, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(unit, dtype=torch.uint8, device="cuda")
    src2, dst2 = src[: 2 << 20], dst[: 2 << 20]
    vmm = Vmm(dev, unit)
    every = args.fresh_every
    aliases = Aliases(vmm, (n // 2 + every - 1) // every)
    kept = None  # mapped once, on first use of the variant
    # Host memory as the shim's pool has it: shared memory registered with the driver
    # (cudaHostRegister), not allocated pinned.
    shm = mmap.mmap(-1, unit, flags=mmap.MAP_SHARED)
    reg = torch.frombuffer(shm, dtype=torch.uint8)
    rc = torch.cuda.cudart().cudaHostRegister(reg.data_ptr(), unit, 0)
    registered = int(rc) == 0
    for _ in range(2):
        chain(n // 4, a, b, c)  # warm

    def mapped_once():
        nonlocal kept
        if kept is None:
            kept = Aliases(vmm, aliases.count)
            for i in range(kept.count):
                kept.map(i)
        return kept

    pool = None

    def pool_ops():
        nonlocal pool
        if pool is None:
            pool = PoolOps(dev)
            pool_chain(n // 4, a, b, c, pool)  # the pool reserves its memory once, not in a timed run
        return pool

    def churn_run(rate):
        stop = threading.Event()
        cycles = [0]

        def body():
            period = 1.0 / rate
            nxt = time.perf_counter()
            while not stop.is_set():
                vmm.cycle()
                cycles[0] += 1
                nxt += period
                d = nxt - time.perf_counter()
                if d > 0:
                    time.sleep(d)

        th = threading.Thread(target=body)
        th.start()
        ms, _ = chain(n, a, b, c)
        stop.set()
        th.join()
        return ms, cycles[0]

    variants = {
        "wait_done": lambda: chain(n, a, b, c, side, 8, "wait_done"),
        "wait_copy": lambda: chain(n, a, b, c, side, 8, "wait_copy", src, dst),
        # 2 MiB copies: the link keeps up with one every 8 launches, so each has landed when waited for.
        "wait_copy_landed": lambda: chain(n, a, b, c, side, 8, "wait_copy_landed", src[: 2 << 20], dst[: 2 << 20]),
        # 72 MiB copies every 128 launches (the link busy about 80% of the time), no waits; and
        # the same, each waited for two copies later: whether a copy itself costs the kernels.
        "copy_only": lambda: chain(n, a, b, c, side, 128, "copy_only", src, dst),
        "copy_wait_landed": lambda: chain(n, a, b, c, side, 128, "copy_wait_landed", src, dst),
        "vmm_churn_250": lambda: churn_run(250),
        "vmm_churn_1000": lambda: churn_run(1000),
        "record": lambda: event_chain(n, a, b, c, "record", side, third, src2, dst2),
        "record_side_wait": lambda: event_chain(n, a, b, c, "record_side_wait", side, third, src2, dst2),
        "pipeline": lambda: event_chain(n, a, b, c, "pipeline", side, third, src2, dst2),
        "vmm_first_use": lambda: fresh_chain(n, a, b, c, aliases, every, False),
        "vmm_use_remap": lambda: fresh_chain(n, a, b, c, aliases, every, True),
        "vmm_mapped_once": lambda: fresh_chain(n, a, b, c, mapped_once(), every, False, kept=True),
        "pool_ops": lambda: pool_chain(n, a, b, c, pool_ops()),
    }
    if registered:
        variants["copy_only_registered"] = lambda: chain(n, a, b, c, side, 128, "copy_only", reg, dst)
    # The host's own cost of one map, access and unmap, apart from any GPU work.
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        vmm.cycle()
    host_us = (time.perf_counter() - t0) / 200 * 1e6
    out = {"launches": n, "gemm": "big" if args.big else args.size, "vmm_cycle_host_us": round(host_us, 1), "variants": {}}
    shape = "2048x6144 against 24 weights of 6144^2" if args.big else f"{args.size}^2"
    print(f"[sync_cost] {n} launches (GEMM {shape} bf16 and an add, in turn); map+access+unmap of "
          f"72 MiB on the host: {host_us:.1f} us")
    if args.only:
        variants = {k: v for k, v in variants.items() if k in args.only.split(",")}
    for name, fn in variants.items():
        plain, with_ = [], []
        ops = 0
        for _ in range(args.repeat):
            plain.append(chain(n, a, b, c)[0])
            ms, k = fn()
            with_.append(ms)
            ops = k
        d = statistics.median(with_) - statistics.median(plain)
        per = d * 1000.0 / ops if ops else float("nan")
        out["variants"][name] = {"plain_ms": plain, "ms": with_, "ops": ops, "us_per_op": round(per, 2)}
        print(f"[sync_cost] {name}: plain median {statistics.median(plain):.2f} ms (runs {', '.join(f'{x:.2f}' for x in plain)}), "
              f"with {statistics.median(with_):.2f} ms ({', '.join(f'{x:.2f}' for x in with_)}); {ops} ops: "
              f"{per:+.2f} us of GPU time each")
    v = out["variants"]

    def difference(name, more, less, what):
        """One variant against another instead of the plain chain, per operation of `more`."""
        if more not in v or less not in v:
            return
        d = statistics.median(v[more]["ms"]) - statistics.median(v[less]["ms"])
        per = d * 1000.0 / v[more]["ops"]
        v[name] = {"us_per_op": round(per, 2)}
        print(f"[sync_cost] {name} ({more} less {less}): {per:+.2f} us of GPU time per {what}")

    difference("new_mapping", "vmm_first_use", "vmm_mapped_once",
               "first read of a range mapped just before, against one mapped once and read before")
    difference("remap_of_used", "vmm_use_remap", "vmm_first_use", "unmap and map of a range just read")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
