"""liboffload from Python: the preloaded shim's step marks, frozen-weight marks and counters.

The shim itself is a launch option (offload-run, or LD_PRELOAD with
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync); this module only talks to it. Without the
preload every function is a no-op that returns what "not loaded" means, except enable(),
which says how to relaunch.
"""

import ctypes
import json

try:
    from ._build import __version__
except ImportError:  # the source tree, not an installed copy
    __version__ = "0+source"

__all__ = ["__version__", "loaded", "enable", "version", "mark_step", "mark_frozen", "stats", "memory_stats"]


def _shim():
    """The preloaded liboffload.so's C API through the process's global scope, or None."""
    lib = ctypes.CDLL(None)
    if not hasattr(lib, "offload_stats_json") or not hasattr(lib, "offload_version"):
        return None
    lib.offload_stats_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.offload_stats_json.restype = ctypes.c_int
    lib.offload_version.restype = ctypes.c_char_p
    lib.offload_mark_read_only.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    lib.offload_mark_read_only.restype = ctypes.c_int
    return lib


_lib = _shim()


def loaded():
    """True when liboffload.so is preloaded into this process."""
    return _lib is not None


def enable():
    """Checks that liboffload is preloaded; raises RuntimeError saying how to relaunch if not.

    The shim must be in the process before CUDA is, so it cannot be loaded from here."""
    if _lib is None:
        raise RuntimeError(
            "liboffload is not preloaded into this process: relaunch with "
            "`offload-run [--budget 40GiB] -- python ...` (or LD_PRELOAD=liboffload.so "
            "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync)")


def version():
    """The preloaded library's version and commit, or None."""
    return _lib.offload_version().decode() if _lib is not None else None


def mark_step():
    """Marks the end of a training step (optional: the shim finds steps by itself)."""
    if _lib is not None:
        _lib.offload_mark_step()


def mark_frozen(model):
    """Marks the parameters of `model` that do not train as read-only (their bytes never need
    copying out again); returns how many were marked."""
    if _lib is None:
        return 0
    n = 0
    for p in model.parameters():
        if not p.requires_grad and p.is_cuda:
            if _lib.offload_mark_read_only(p.data_ptr(), p.numel() * p.element_size()) == 0:
                n += 1
    return n


def stats():
    """Everything the shim counts (offload_stats_json), as a dict; {} when not loaded."""
    if _lib is None:
        return {}
    size = 1 << 16
    while size <= 1 << 26:
        buf = ctypes.create_string_buffer(size)
        n = _lib.offload_stats_json(buf, size)
        if n >= 0:
            return json.loads(buf.raw[:n].decode("utf-8", "replace"))
        size *= 4  # -1: the buffer was too small
    return {}


def memory_stats():
    """The device memory under the budget, as the shim counts it (torch.cuda.memory_allocated()
    counts evicted bytes as allocated): budget, held and footprint peak (bytes), evicted and
    reloaded bytes, demand reloads (misses) and prefetches. {} when not loaded or no budget."""
    r = stats().get("residency")
    if not r:
        return {}
    return {
        "budget_bytes": r["budget"],
        "held_bytes": r["held"],
        "footprint_peak_bytes": r["footprint_peak"],
        "evicted_bytes": r["bytes_out"],
        "reloaded_bytes": r["bytes_in"] + r["prefetch_bytes"],
        "misses": r["reloads"],
        "prefetches": r["prefetches"],
        "error": r["error"],
    }
