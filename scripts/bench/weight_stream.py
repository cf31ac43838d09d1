"""Hand-written per-layer weight streaming: the baseline the `lora` workload's `stream` mode runs.

What it does. Layer-offload trainers (frozen base, small adapters) keep the transformer
blocks' frozen weights in pinned host memory and copy each block to the GPU shortly before
it runs. This is that technique, written carefully:

- At build time each block's frozen base weights (qkv, proj, fc1, fc2 of the `lora`
  workload) are copied into one pinned flat host buffer per block, the tensors laid out as
  views at 512-byte aligned offsets, and the GPU copies are freed. Everything else (the
  adapters, LayerNorms, embedding, head) stays resident.
- The GPU keeps a ring of K flat buffers ("slots"), each the size of the largest block.
  Before a block runs, its weight Parameters are pointed (`param.data = view`) at views of
  the slot that holds it, at the same offsets as in the host buffer. The kernels, their
  order and the bf16 values are exactly those of the resident model; only the addresses
  of the weights differ (512-byte aligned in both).
- One side stream does every host-to-device copy (non_blocking, from pinned memory).
  Nothing is copied back: the weights are frozen.
- The blocks run under non-reentrant activation checkpointing (the `ckpt` model), so a
  training step uses the blocks in the order fwd 0..L-1, then bwd L-1..0, where the
  backward use of block i is its recomputed forward followed by its backward. Consecutive
  uses of the same block share one copy: block L-1 (the end of the forward and the start
  of the backward) and block 0 (the end of one step's backward and the start of the next
  step's forward). The copies in the steady state follow the cycle
  0, 1, ..., L-1, L-2, ..., 1: 2L-2 block copies a step.
- Copy n goes to slot n mod K. A forward pre-hook on every block (it runs again at the
  recompute) drives it: when block i starts a use, the previous copy's use has been fully
  enqueued on the compute stream (all of its forward kernels, or in backward all the
  kernels that read its weights: they produce the gradient that reaches block i's output,
  so autograd runs them before block i's recompute), so an event is recorded on the
  compute stream to release that copy's slot, and the copy that will use the slot next
  (K copies later) is issued: the side stream waits on that event first, so no slot is
  overwritten while a kernel may still read it. Then the compute stream waits on the
  event recorded after block i's own copy. While block i runs, the next K-1 blocks in the
  cycle are being copied or are ready.
- Streams are taken when used (torch.cuda.current_stream() at each hook), never captured
  at build time; events only, no synchronisation in the steady state; nothing random.
- The hook checks that blocks run in the expected order and raises otherwise (an eval
  forward without backward, or plain mode without checkpointing, would break the schedule:
  a backward that reads a weight saved in the forward needs its block resident then).

Why it is a fair, competent baseline. It does what the layer-offload trainers do, with the
fixes their known bugs call for: slots are released by events recorded after the last
use in backward too (the race bug of releasing after the forward only), pinned memory is
allocated once per block (not per tensor, not one huge registration), streams are those
in use, copies are prefetched K-1 blocks ahead and bounded by the ring (no burst), and the
turn-around blocks are not copied twice. The weights are contiguous per block so each
copy is one large transfer at full link speed. In the steady state a step moves
(2L-2) x (block bytes) host to device; at the full shapes that is 86 x 0.84 GiB = 77.9 GB,
about 1.45 s at 53.8 GB/s, against roughly three seconds of compute, so the copies can hide
behind the compute: a step should cost little more than the resident checkpointed step.

Memory it needs. On the device: K slots of the largest block's frozen weights (at the full
shapes 12 d^2 bf16 = 0.84 GiB a slot, 2.53 GiB for K=3) in place of all L blocks' weights
(37.1 GiB), plus whatever the checkpointed run needs besides. On the host: one pinned
buffer per block, the size of the block's weights (PyTorch's pinned allocator may round
each one up to a power of two: 1 GiB a block at the full shapes, 44 GiB in all).
"""

import torch

# Offsets of the tensors in a block's flat buffer are multiples of this many bytes, like
# the allocations PyTorch's allocators return, so that the kernels see the same alignment.
ALIGN_BYTES = 512


class WeightStream:
    """Streams the frozen weights `names` of each block in `blocks` through a ring of `ring`
    device slots (see the module docstring). `blocks` run under non-reentrant checkpointing,
    forward 0..L-1 then backward L-1..0, every step."""

    def __init__(self, blocks, names, ring=3):
        blocks = list(blocks)
        if len(blocks) < 2:
            raise ValueError("weight stream: needs at least 2 blocks")
        if ring < 1:
            raise ValueError(f"weight stream: ring of {ring} slots; needs at least 1")
        self.ring = ring
        self.layout = []  # per block: (pinned host buffer, [(param, offset, numel, shape)])
        self.dtype = None
        slot_numel = 0
        for b, blk in enumerate(blocks):
            params = [blk.get_submodule(n).weight for n in names]
            dtype = params[0].dtype
            self.dtype = self.dtype or dtype
            align = ALIGN_BYTES // params[0].element_size()
            entries, off = [], 0
            for name, p in zip(names, params):
                if p.requires_grad or not p.is_cuda or p.dtype != self.dtype or not p.is_contiguous():
                    raise ValueError(f"weight stream: block {b} {name}.weight must be a frozen, "
                                     f"contiguous {self.dtype} CUDA tensor")
                entries.append((p, off, p.numel(), p.shape))
                off = (off + p.numel() + align - 1) // align * align
            host = torch.empty(off, dtype=self.dtype, pin_memory=True)
            for p, o, n, shape in entries:
                view = host[o:o + n].view(shape)
                view.copy_(p.data)  # device to pinned host, synchronous
                p.data = view  # frees the device copy; outside a use the weight is on the host
            self.layout.append((host, entries))
            slot_numel = max(slot_numel, off)
        self.slot_numel = slot_numel
        self.slots = [torch.empty(slot_numel, dtype=self.dtype, device="cuda") for _ in range(ring)]
        self.ready = [torch.cuda.Event() for _ in range(ring)]     # after the copy into a slot
        self.released = [torch.cuda.Event() for _ in range(ring)]  # after the last use of a slot
        self.copy_stream = torch.cuda.Stream()

        L = len(blocks)
        self.uses = list(range(L)) + list(range(L - 1, -1, -1))  # one step: fwd, then bwd
        self.cycle = list(range(L)) + list(range(L - 2, 0, -1))  # copies, steady state
        self.use = 0      # uses started so far (all steps)
        self.current = -1  # index of the copy in use (all steps); -1 before the first use
        self.issued = 0   # copies issued so far
        for b, blk in enumerate(blocks):
            blk.register_forward_pre_hook(lambda module, args, b=b: self.enter(b))

    def _issue(self):
        """Issues copy number `self.issued` into its slot, after the slot's previous use."""
        n = self.issued
        slot, (host, _) = n % self.ring, self.layout[self.cycle[n % len(self.cycle)]]
        with torch.cuda.stream(self.copy_stream):
            if n >= self.ring:
                self.copy_stream.wait_event(self.released[slot])
            self.slots[slot][:host.numel()].copy_(host, non_blocking=True)
            self.ready[slot].record(self.copy_stream)
        self.issued += 1

    def enter(self, b):
        """Block b starts a use (its forward, or its recompute in backward)."""
        expected = self.uses[self.use % len(self.uses)]
        if b != expected:
            raise RuntimeError(
                f"weight stream: block {b} ran where block {expected} was expected (use {self.use}); "
                "the schedule is forward 0..L-1 then backward L-1..0 under checkpointing, every step")
        compute = torch.cuda.current_stream()
        if self.current < 0:
            # First use: the slots were allocated on the compute stream; fill the ring.
            self.copy_stream.wait_stream(compute)
            for _ in range(self.ring):
                self._issue()
            self.current = 0
        elif b != self.uses[(self.use - 1) % len(self.uses)]:
            # The previous copy's last use is enqueued: release its slot, refill it.
            self.released[self.current % self.ring].record(compute)
            self.current += 1
            self._issue()
        if self.cycle[self.current % len(self.cycle)] != b:
            raise RuntimeError(f"weight stream: internal error: copy {self.current} is not block {b}")
        slot = self.current % self.ring
        compute.wait_event(self.ready[slot])
        for p, o, n, shape in self.layout[b][1]:
            p.data = self.slots[slot][o:o + n].view(shape)
        self.use += 1

    def info(self):
        """Sizes for the log and the result JSON."""
        elem = torch.empty(0, dtype=self.dtype).element_size()
        block_bytes = [host.numel() * elem for host, _ in self.layout]
        return {
            "ring": self.ring,
            "kept_blocks": getattr(self, "kept", 0),
            "blocks": len(self.layout),
            "streamed_params": sum(n for _, entries in self.layout for _, _, n, _ in entries),
            "slot_bytes": self.slot_numel * elem,
            "ring_bytes": self.ring * self.slot_numel * elem,
            "host_bytes": sum(block_bytes),
            "copies_per_step": len(self.cycle),
            "h2d_bytes_per_step": sum(block_bytes[b] for b in self.cycle),
        }
