#!/usr/bin/env python3
"""Runs one benchmark workload and prints `RESULT <json>` (see README.md).

  python3 scripts/bench/run.py --workload reference --mode plain [--steps 20] [--warmup 3]
      [--compile] [--deterministic] [--route {1,2}] [--mark-steps] [--json-out FILE] [--small]
      [--dist {ddp,fsdp}]

--workload lora --mode stream: the hand-written weight-streaming baseline (weight_stream.py;
ring size from $WEIGHT_STREAM_RING, default 3), eager and on one GPU only.

Route 1 (default): the caller sets PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (and
LD_PRELOAD=liboffload.so for an offload run). Route 2: PyTorch's allocator is replaced by
liboffload's CUDAPluggableAllocator pair, loaded from $OFFLOAD_LIB. An offload run also sets
OFFLOAD_DEVICE_BUDGET (and OFFLOAD_HOST_POOL) and passes a --warmup long enough for the
shim's plan to be installed before the peaks are reset (--warmup 8).

Several GPUs: under `torchrun --nproc-per-node N`, --dist ddp wraps the model in
DistributedDataParallel and --dist fsdp shards it with FSDP2 (fully_shard per block, then the
root). Every rank builds the same model and reads its own batches; each rank prints its own
RESULT and writes FILE with "-rank<R>" before its extension.
"""

import argparse
import ctypes
import glob
import hashlib
import json
import os
import site
import sys
import threading
import time

# cudaMemPoolAttr values, from /usr/local/cuda-13.0/include/driver_types.h (enum cudaMemPoolAttr).
CUDA_MEMPOOL_ATTR_RESERVED_MEM_HIGH = 0x6
CUDA_MEMPOOL_ATTR_USED_MEM_HIGH = 0x8

SHIM_STATS_BUF = 64 * 1024


def log(*a):
    print("[bench]", *a, flush=True)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", required=True, choices=("reference", "convnet", "llama", "lora", "moe"))
    p.add_argument("--mode", default="plain", choices=("plain", "ckpt", "save_on_cpu", "stream"))
    p.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps before (default 3)")
    p.add_argument("--compile", action="store_true", help="torch.compile(model)")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic algorithms, CUBLAS_WORKSPACE_CONFIG=:4096:8, cudnn deterministic")
    p.add_argument("--route", type=int, default=1, choices=(1, 2),
                   help="1: backend from PYTORCH_CUDA_ALLOC_CONF; 2: CUDAPluggableAllocator from $OFFLOAD_LIB")
    p.add_argument("--mark-steps", action="store_true", help="call offload_mark_step() after each step")
    p.add_argument("--keep-pool", action="store_true",
                   help="no torch.cuda.empty_cache() or pool trim when the peaks are reset (as in a training "
                        "script): the pool keeps what the warm-up steps reserved unless the shim trims it")
    p.add_argument("--mark-frozen", action="store_true",
                   help="call offload_mark_read_only() for every parameter that does not require grad")
    p.add_argument("--profile", action="store_true",
                   help="run the timed steps under torch.profiler (CPU+CUDA): another CUPTI client")
    p.add_argument("--json-out", metavar="FILE", help="also write the result JSON here")
    p.add_argument("--small", action="store_true", help="shrunken shapes for smoke runs")
    p.add_argument("--seed", type=int, default=0, help="model and data seed (default 0)")
    p.add_argument("--dist", choices=("ddp", "fsdp"),
                   help="under torchrun: DistributedDataParallel, or FSDP2 (fully_shard)")
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    if args.mode == "stream" and args.workload not in ("lora", "moe"):
        p.error("--mode stream (weight streaming) is only for --workload lora or moe")
    if args.mode == "stream" and (args.compile or args.dist):
        p.error("--mode stream runs eager on one GPU (no --compile, no --dist)")
    return args


# --------------------------------------------------------------------------- CUDA runtime

def load_cudart(torch):
    """libcudart.so.13: the copy torch already loaded if dlopen finds it by soname, else a
    copy from the wheel directories. The default mempool is the driver's either way."""
    try:
        return ctypes.CDLL("libcudart.so.13")
    except OSError:
        pass
    site_dirs = set(site.getsitepackages() + [site.getusersitepackages()])
    site_dirs.add(os.path.dirname(os.path.dirname(torch.__file__)))
    patterns = [os.path.join(os.path.dirname(torch.__file__), "lib", "libcudart.so.13*")]
    patterns += [os.path.join(d, "nvidia", "*", "lib", "libcudart.so.13*") for d in sorted(site_dirs)]
    patterns.append("/usr/local/cuda/lib64/libcudart.so.13*")
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                return ctypes.CDLL(path)
            except OSError:
                continue
    return None


class DefaultMemPool:
    """The device's default stream-ordered pool (used by backend:cudaMallocAsync and by
    liboffload's route-2 allocator), read through the CUDA runtime."""

    def __init__(self, cudart, device):
        self.rt = cudart
        vp, u64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64)
        cudart.cudaDeviceGetDefaultMemPool.argtypes = [ctypes.POINTER(vp), ctypes.c_int]
        cudart.cudaMemPoolGetAttribute.argtypes = [vp, ctypes.c_int, u64p]
        cudart.cudaMemPoolSetAttribute.argtypes = [vp, ctypes.c_int, u64p]
        cudart.cudaMemPoolTrimTo.argtypes = [vp, ctypes.c_size_t]
        for f in (cudart.cudaDeviceGetDefaultMemPool, cudart.cudaMemPoolGetAttribute,
                  cudart.cudaMemPoolSetAttribute, cudart.cudaMemPoolTrimTo):
            f.restype = ctypes.c_int
        self.pool = ctypes.c_void_p()
        self._check(cudart.cudaDeviceGetDefaultMemPool(ctypes.byref(self.pool), device), "cudaDeviceGetDefaultMemPool")

    @staticmethod
    def _check(err, what):
        if err != 0:
            raise RuntimeError(f"{what} failed: cudaError {err}")

    def get(self, attr):
        v = ctypes.c_uint64(0)
        self._check(self.rt.cudaMemPoolGetAttribute(self.pool, attr, ctypes.byref(v)), "cudaMemPoolGetAttribute")
        return v.value

    def reset_high(self):
        # Zero is the only valid value: the driver resets the mark to the current value.
        for attr in (CUDA_MEMPOOL_ATTR_RESERVED_MEM_HIGH, CUDA_MEMPOOL_ATTR_USED_MEM_HIGH):
            zero = ctypes.c_uint64(0)
            self._check(self.rt.cudaMemPoolSetAttribute(self.pool, attr, ctypes.byref(zero)), "cudaMemPoolSetAttribute")

    def trim(self):
        self._check(self.rt.cudaMemPoolTrimTo(self.pool, 0), "cudaMemPoolTrimTo")


# --------------------------------------------------------------------------- shim

class Shim:
    """liboffload's exported C API, when the library is in the process."""

    def __init__(self, route, lib_path):
        handles = [ctypes.CDLL(None)]  # global scope: the main program and LD_PRELOAD libraries
        if route == 2:
            handles.append(ctypes.CDLL(lib_path))  # already dlopen'ed by torch: same handle
        self.mark_step_fn = self.stats_fn = self.reset_peak_fn = self.read_only_fn = None
        for h in handles:
            self.mark_step_fn = self.mark_step_fn or getattr(h, "offload_mark_step", None)
            self.read_only_fn = self.read_only_fn or getattr(h, "offload_mark_read_only", None)
            self.stats_fn = self.stats_fn or getattr(h, "offload_stats_json", None)
            self.reset_peak_fn = self.reset_peak_fn or getattr(h, "offload_reset_peak", None)
        if self.mark_step_fn:
            self.mark_step_fn.argtypes, self.mark_step_fn.restype = [], None
        if self.reset_peak_fn:
            self.reset_peak_fn.argtypes, self.reset_peak_fn.restype = [], None
        if self.read_only_fn:
            self.read_only_fn.argtypes, self.read_only_fn.restype = [ctypes.c_void_p, ctypes.c_size_t], ctypes.c_int
        if self.stats_fn:
            self.stats_fn.argtypes, self.stats_fn.restype = [ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int

    @property
    def loaded(self):
        return bool(self.mark_step_fn or self.stats_fn)

    def mark_step(self):
        if self.mark_step_fn:
            self.mark_step_fn()

    def reset_peak(self):
        """New high-water marks of the executor's held_peak / device_peak (an older
        liboffload without offload_reset_peak: nothing to reset)."""
        if self.reset_peak_fn:
            self.reset_peak_fn()

    def stats(self):
        if not self.stats_fn:
            return None
        buf = ctypes.create_string_buffer(SHIM_STATS_BUF)
        n = self.stats_fn(buf, SHIM_STATS_BUF)
        if n < 0:
            return {"error": f"offload_stats_json returned {n}"}
        text = buf.raw[:n].decode("utf-8", "replace")
        try:
            return json.loads(text)
        except ValueError as e:
            return {"error": f"unparsable offload_stats_json output: {e}", "raw": text}


def executor_summary(stats):
    """One log line about the shim's executor from offload_stats_json()'s "executor", or
    None when there is none (no shim, an older shim, or no budget)."""
    x = (stats or {}).get("executor")
    if not isinstance(x, dict):
        return None
    if not x.get("on"):
        return "executor off (no OFFLOAD_DEVICE_BUDGET)"
    active = x.get("steps_active") or 0
    out = (x.get("bytes_out") or 0) / active / 2**30 if active else 0.0
    inn = (x.get("bytes_in") or 0) / active / 2**30 if active else 0.0
    return (f"executor: plan [{x.get('plan') or 'none'}] installed={x.get('installed')} "
            f"deviated={x.get('deviated')} installs={x.get('installs')} deviations={x.get('deviations')} "
            f"steps_active={active} misses/step (recent) {x.get('recent_misses')} total {x.get('misses')}; "
            f"evictions {x.get('evictions')} (abandoned {x.get('evictions_abandoned')}) reloads {x.get('reloads')}; "
            f"per active step {out:.2f} GiB out (D2H) + {inn:.2f} GiB in (H2D); held_peak {(x.get('held_peak') or 0) / 2**30:.2f} GiB "
            f"device_peak {(x.get('device_peak') or 0) / 2**30:.2f} GiB budget {(x.get('budget') or 0) / 2**30:.2f} GiB "
            f"over_budget {x.get('over_budget')} budget_waits {x.get('budget_waits')} handovers {x.get('handovers')}")


# --------------------------------------------------------------------------- main

def grad_sha256(torch, params):
    h = hashlib.sha256()
    for i, p in enumerate(params):
        if p.grad is None:
            h.update(f"<{i}:none>".encode())
        else:
            g = local_shard(torch, p.grad.detach())
            h.update(g.reshape(-1).contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def local_shard(torch, t):
    """A DTensor's local shard (FSDP2), else the tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def rank_path(path, rank):
    root, ext = os.path.splitext(path)
    return f"{root}-rank{rank}{ext or '.json'}"


def shard_model(model, kind, device):
    """--dist: DDP around the model, or FSDP2 on each repeated block and then the root."""
    import torch
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[device])
    from torch.distributed.fsdp import fully_shard
    blocks = getattr(model, "blocks", None)
    if blocks is None and hasattr(model, "model") and hasattr(model.model, "layers"):
        blocks = model.model.layers  # LlamaForCausalLM
    if blocks is None:
        raise SystemExit("run.py: --dist fsdp needs a model with repeated blocks (reference, llama)")
    for blk in blocks:
        fully_shard(blk)
    fully_shard(model)
    return model


def main(argv=None):
    args = parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if args.dist and "LOCAL_RANK" not in os.environ:
        sys.exit("run.py: --dist needs torchrun (LOCAL_RANK is not set)")
    if args.dist and args.json_out:
        args.json_out = rank_path(args.json_out, rank)

    # Environment that must be in place before torch initialises CUDA.
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        if args.compile:
            # Inductor: no on-device benchmarking that changes numerics (reduction configs).
            os.environ.setdefault("TORCHINDUCTOR_DETERMINISTIC", "1")
    lib_path = None
    if args.route == 2:
        lib_path = os.environ.get("OFFLOAD_LIB")
        if not lib_path:
            sys.exit("run.py: --route 2 needs OFFLOAD_LIB=/path/to/liboffload.so in the environment")
        if not os.path.isfile(lib_path):
            sys.exit(f"run.py: OFFLOAD_LIB={lib_path} is not a file")
        lib_path = os.path.abspath(lib_path)

    import torch

    if args.route == 2:
        alloc = torch.cuda.memory.CUDAPluggableAllocator(lib_path, "offload_malloc", "offload_free")
        torch.cuda.memory.change_current_allocator(alloc)
    if args.deterministic:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import workloads

    if not torch.cuda.is_available():
        sys.exit("run.py: no CUDA device")
    if args.dist:
        import torch.distributed as dist
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank))
    device = torch.cuda.current_device()
    # The driver's used-memory figure before the model: the context, and other processes'.
    free0, _ = torch.cuda.mem_get_info()
    used_before = torch.cuda.mem_get_info()[1] - free0

    # Every rank builds the same model (seed); its batches come from its own data seed.
    model, make_batch, loss_fn, make_optimizer = workloads.build(
        args.workload, args.mode, args.small, args.seed, data_seed=args.seed + 1000 * rank)
    if args.dist:
        model = shard_model(model, args.dist, device)
    # The parameters that train: all of them, except lora's frozen base (the gradient hash and
    # the optimizer cover these only).
    all_params = list(model.parameters())
    params = [p for p in all_params if p.requires_grad]
    opt = make_optimizer(params)
    stream = getattr(model, "weight_stream", None)
    stream_info = stream.info() if stream is not None else None
    run_model = torch.compile(model) if args.compile else model

    backend = "pluggable:liboffload" if args.route == 2 else torch.cuda.get_allocator_backend()
    if args.route == 1 and backend != "cudaMallocAsync":
        log(f"WARNING: allocator backend is {backend!r}, not cudaMallocAsync "
            "(set PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync for comparable numbers)")
    use_pool = args.route == 2 or backend == "cudaMallocAsync"
    pool = None
    if use_pool:
        cudart = load_cudart(torch)
        if cudart is None:
            log("WARNING: libcudart.so.13 not found; pool high-water mark unavailable")
        else:
            pool = DefaultMemPool(cudart, device)
    shim = Shim(args.route, lib_path)
    if args.mark_steps and not shim.loaded:
        log("--mark-steps: liboffload is not loaded, nothing to mark")
    if args.mark_frozen:
        frozen = [p for p in all_params if not p.requires_grad and p.is_cuda]
        if not shim.read_only_fn:
            log("--mark-frozen: liboffload is not loaded, nothing to mark")
        else:
            for p in frozen:
                if shim.read_only_fn(p.data_ptr(), p.numel() * p.element_size()) != 0:
                    raise RuntimeError("offload_mark_read_only refused a parameter")
            log(f"--mark-frozen: {len(frozen)} frozen parameters marked read-only, "
                f"{sum(p.numel() * p.element_size() for p in frozen) / 2**30:.2f} GiB")
    log(f"workload={args.workload} mode={args.mode} compile={args.compile} deterministic={args.deterministic} "
        f"route={args.route} backend={backend} shim={'yes' if shim.loaded else 'no'} small={args.small} "
        f"params={sum(p.numel() for p in all_params)} trainable={sum(p.numel() for p in params)}"
        + (f" dist={args.dist} rank={rank}/{world}" if args.dist else ""))
    if stream_info:
        log(f"weight stream: {stream_info['blocks']} blocks, {stream_info['streamed_params']} streamed params, "
            f"ring {stream_info['ring']} x {stream_info['slot_bytes'] / 2**30:.3f} GiB = "
            f"{stream_info['ring_bytes'] / 2**30:.2f} GiB on the device, {stream_info['host_bytes'] / 2**30:.2f} GiB "
            f"pinned on the host, {stream_info['copies_per_step']} copies = "
            f"{stream_info['h2d_bytes_per_step'] / 2**30:.2f} GiB H2D a step")

    total = args.warmup + args.steps
    losses = torch.zeros(total, dtype=torch.float32, device="cuda")

    def forward_backward(i):
        loss = loss_fn(run_model, make_batch(i))
        loss.backward()
        losses[i].copy_(loss.detach().float())

    def finish_step():
        opt.step()
        opt.zero_grad(set_to_none=True)
        if args.mark_steps:
            shim.mark_step()

    # The driver's used memory, sampled every 2 ms from the last warm-up step to the end of the
    # timed ones: everything on the device at one moment (the pool, the shim's own blocks and
    # arenas, workspaces), where the footprint sums high-water marks reached at different times.
    sampled = {"peak": 0, "n": 0}
    stop_sampling = threading.Event()

    def sample_used():
        while not stop_sampling.is_set():
            f, t = torch.cuda.mem_get_info()
            sampled["peak"] = max(sampled["peak"], t - f)
            sampled["n"] += 1
            stop_sampling.wait(0.002)

    sampler = threading.Thread(target=sample_used, daemon=True)

    def reset_peaks():
        torch.cuda.synchronize()
        if args.route != 2:
            if not args.keep_pool:
                torch.cuda.empty_cache()  # cudaMallocAsync: trims the pool; native: frees cached blocks
            torch.cuda.reset_peak_memory_stats()
        if pool:
            if not args.keep_pool:
                pool.trim()
            pool.reset_high()
        shim.reset_peak()  # the executor's arena high-water marks, at the same moment
        # Sampling starts once the pool is trimmed: before it, what warm-up freed (the stream
        # baseline's weights, copied to the host) was still reserved, and the sampled peak
        # overstated the run's by far.
        if not sampler.is_alive():
            sampler.start()

    # Warm-up. The peak counters are reset (and the pool trimmed, so that warm-up and
    # compilation transients do not count) before the last warm-up step rather than the first
    # timed one: the pool's regrowth then falls outside the timed steps; every step in the
    # measured window is a steady-state training step.
    for i in range(args.warmup):
        if i == args.warmup - 1:
            reset_peaks()
        forward_backward(i)
        finish_step()
    if args.warmup == 0:
        reset_peaks()

    profiler = None
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        profiler = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
        profiler.__enter__()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    paused = 0.0
    grad_hash = None
    # Per-step GPU times: an event on the current stream where each timed step starts, no host
    # wait. The last step holds the untimed gradient hash, so step_ms has steps - 1 entries.
    starts = []
    timed_plan = None
    for i in range(args.warmup, total):
        if i == total - 1 and shim.loaded:
            # The plan the timed steps ran, read before the last one: its gradient hash launches
            # kernels no plan has seen, after which the shim plans again (from a step that ends
            # the run), and the stats at the end describe that plan.
            x = (shim.stats() or {}).get("executor")
            if isinstance(x, dict):
                timed_plan = {k: x.get(k) for k in ("plan", "planner", "installs", "steps_active")}
        starts.append(torch.cuda.Event(enable_timing=True))
        starts[-1].record()
        forward_backward(i)
        if i == total - 1:
            # Final gradients: after the last backward, before its optimizer step; not timed.
            torch.cuda.synchronize()
            tp = time.perf_counter()
            grad_hash = grad_sha256(torch, params)
            paused = time.perf_counter() - tp
        finish_step()
    torch.cuda.synchronize()
    ms_per_step = (time.perf_counter() - t0 - paused) * 1000.0 / args.steps
    step_ms = [a.elapsed_time(b) for a, b in zip(starts, starts[1:])]
    stop_sampling.set()
    sampler.join()
    if profiler is not None:
        profiler.__exit__(None, None, None)
        kernels = sum(1 for e in profiler.events() if e.device_type.name == "CUDA")
        log(f"torch.profiler recorded {kernels} CUDA events")

    if pool:
        peak_reserved, peak_source = pool.get(CUDA_MEMPOOL_ATTR_RESERVED_MEM_HIGH), "mempool_reserved_high"
        pool_used_high = pool.get(CUDA_MEMPOOL_ATTR_USED_MEM_HIGH)
    elif use_pool:
        peak_reserved, peak_source, pool_used_high = None, "unavailable", None
    else:
        peak_reserved, peak_source = torch.cuda.max_memory_reserved(), "max_memory_reserved"
        pool_used_high = None
    max_allocated = None if args.route == 2 else torch.cuda.max_memory_allocated()
    free, total_mem = torch.cuda.mem_get_info()
    loss_values = losses.tolist()
    shim_stats = shim.stats() if shim.loaded else None
    # The device footprint: the pool's high-water mark plus the physical memory the executor's
    # arenas held at their peak (PyTorch's counters still count evicted tensors; docs/design.md).
    executor = (shim_stats or {}).get("executor")
    held_peak = executor.get("held_peak") if isinstance(executor, dict) else None
    # Large allocations the shim serves itself (OFFLOAD_PERSISTENT_MIN) are not in the pool.
    persistent = (shim_stats or {}).get("persistent")
    persistent_peak = persistent.get("peak_bytes") if isinstance(persistent, dict) else None
    if peak_reserved is None:
        footprint = None
    else:
        footprint = peak_reserved + (held_peak or 0) + (persistent_peak or 0)

    result = {
        "workload": args.workload,
        "mode": args.mode,
        "compile": args.compile,
        "mark_frozen": args.mark_frozen,
        "deterministic": args.deterministic,
        "route": args.route,
        "small": args.small,
        "seed": args.seed,
        "warmup": args.warmup,
        "keep_pool": args.keep_pool,
        "steps": args.steps,
        "ms_per_step": ms_per_step,
        "step_ms": step_ms,
        "peak_reserved_high_bytes": peak_reserved,
        "footprint_peak_bytes": footprint,
        "offload_budget": os.environ.get("OFFLOAD_DEVICE_BUDGET") or None,
        "peak_source": peak_source,
        "pool_used_high_bytes": pool_used_high,
        "max_memory_allocated": max_allocated,
        "device_used_bytes": total_mem - free,
        # Sampled (every 2 ms): the most the driver counted in use, less what it counted before
        # the model was built.
        "device_used_peak_bytes": sampled["peak"] - used_before if sampled["n"] else None,
        "device_used_samples": sampled["n"],
        "device_total_bytes": total_mem,
        "losses": loss_values,
        "losses_hex": [float.hex(v) for v in loss_values],
        "grad_sha256": grad_hash,
        "allocator_backend": backend,
        "torch_version": torch.__version__,
        "gpu": torch.cuda.get_device_name(device),
        "dist": args.dist,
        "params": sum(p.numel() for p in all_params),
        "trainable_params": sum(p.numel() for p in params),
        "weight_stream": stream_info,
        "rank": rank,
        "world_size": world,
        "shim": shim_stats,
        "timed_plan": timed_plan,
    }
    peak_txt = f"{peak_reserved / 2**30:.2f} GiB" if peak_reserved is not None else "n/a"
    fp_txt = f"{footprint / 2**30:.2f} GiB" if footprint is not None else "n/a"
    log(f"{'rank %d: ' % rank if args.dist else ''}{ms_per_step:.1f} ms/step, peak {peak_txt} ({peak_source}), footprint {fp_txt}, "
        f"loss {loss_values[0]:.4f} -> {loss_values[-1]:.4f}, grad sha256 {grad_hash[:16]}")
    summary = executor_summary(shim_stats)
    if summary:
        log(summary)
    elif os.environ.get("OFFLOAD_DEVICE_BUDGET"):
        log("WARNING: OFFLOAD_DEVICE_BUDGET is set but the shim reported no executor")
    line = json.dumps(result)
    print("RESULT " + line, flush=True)
    if args.json_out:
        with open(args.json_out, "w") as f:
            f.write(line + "\n")
    if args.dist:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
