"""Benchmark workloads for liboffload (see docs/design.md, "Facts about the target").

Each builder returns (model, make_batch, loss_fn, make_optimizer):
  make_batch(step) -> inputs      same data for a given (seed, step) on every run
  loss_fn(model, inputs) -> loss  scalar tensor; `model` may be the torch.compile'd module
  make_optimizer(params) -> torch.optim.Optimizer

Modes: plain | ckpt (non-reentrant activation checkpointing per block / stage) |
save_on_cpu (forward + loss under torch.autograd.graph.save_on_cpu(pin_memory=True)) |
stream (`lora` and `moe` only: ckpt, the blocks' frozen weights streamed from pinned host memory through
a ring of device slots; weight_stream.py, ring size from $WEIGHT_STREAM_RING, default 3; the
first $WEIGHT_STREAM_KEEP blocks resident, default 0).
Weights are built from code with torch.manual_seed(seed); nothing is downloaded.
"""

import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

WORKLOADS = ("reference", "convnet", "llama", "lora", "moe")
MODES = ("plain", "ckpt", "save_on_cpu", "stream")
DEVICE = "cuda"


def _batch_generator(seed):
    """A device generator re-seeded per step: batch k is the same on every run."""
    gen = torch.Generator(device=DEVICE)

    def seeded(step):
        gen.manual_seed(seed * 1_000_003 + step)
        return gen

    return seeded


def _next_token_io(vocab, batch, seq, seed):
    """Batches of random tokens (inputs, and the next tokens as targets) and the
    cross-entropy loss of a model's logits on them."""
    gen = _batch_generator(seed)

    def make_batch(step):
        tok = torch.randint(0, vocab, (batch, seq + 1), generator=gen(step), device=DEVICE)
        return tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    def loss_fn(m, inputs):
        idx, tgt = inputs
        logits = m(idx)
        return F.cross_entropy(logits.view(-1, vocab), tgt.view(-1))

    return make_batch, loss_fn


# --------------------------------------------------------------------------- reference

class Block(nn.Module):
    """Pre-LN transformer block: causal SDPA attention + 4x GELU MLP, residuals.
    `linear` builds the four projections (nn.Linear; LoRALinear for `lora`)."""

    def __init__(self, d, heads, linear=nn.Linear, **dd):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, **dd)
        self.qkv = linear(d, 3 * d, **dd)
        self.proj = linear(d, d, **dd)
        self.ln2 = nn.LayerNorm(d, **dd)
        self.fc1 = linear(d, 4 * d, **dd)
        self.fc2 = linear(4 * d, d, **dd)

    def forward(self, x):
        x = x + _attention(self, x)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


def _attention(blk, x):
    """Causal self-attention of a pre-LN block with ln1, qkv, proj and heads."""
    b, t, d = x.shape
    qkv = blk.qkv(blk.ln1(x)).view(b, t, 3, blk.heads, d // blk.heads)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (b, heads, t, hd)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return blk.proj(a.transpose(1, 2).reshape(b, t, d))


class Transformer(nn.Module):
    """Embedding, `layers` blocks (Block, or what `block()` builds), final LayerNorm, head."""

    def __init__(self, vocab, d, heads, layers, ckpt=False, linear=nn.Linear, block=None, **dd):
        super().__init__()
        self.ckpt = ckpt
        self.embed = nn.Embedding(vocab, d, **dd)
        block = block or (lambda: Block(d, heads, linear=linear, **dd))
        self.blocks = nn.ModuleList(block() for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, **dd)
        self.head = nn.Linear(d, vocab, bias=False, **dd)

    def forward(self, idx):
        x = self.embed(idx)
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.ckpt else blk(x)
        return self.head(self.ln_f(x))


def build_reference(mode, small, seed):
    vocab, d, heads, layers, batch, seq = (8000, 512, 8, 2, 2, 256) if small else (32000, 2048, 16, 16, 8, 2048)
    model = Transformer(vocab, d, heads, layers, ckpt=(mode == "ckpt"), device=DEVICE, dtype=torch.bfloat16)
    model.train()
    make_batch, loss_fn = _next_token_io(vocab, batch, seq, seed)

    def make_optimizer(params):
        return torch.optim.AdamW(params, lr=1e-4)

    return model, make_batch, loss_fn, make_optimizer


# --------------------------------------------------------------------------- convnet

class StageCheckpointed(nn.Module):
    """ResNet forward with each of the 4 stages under non-reentrant checkpointing."""

    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x):
        n = self.net
        x = n.maxpool(n.relu(n.bn1(n.conv1(x))))
        for stage in (n.layer1, n.layer2, n.layer3, n.layer4):
            x = checkpoint(stage, x, use_reentrant=False)
        return n.fc(torch.flatten(n.avgpool(x), 1))


def build_convnet(mode, small, seed):
    """ResNet-50, fp32 parameters, bf16 autocast for the forward, channels_last.

    Note: under ckpt, BatchNorm running stats are updated again on recompute; this
    does not affect training-mode outputs or gradients.
    """
    import torchvision

    batch, hw = (8, 64) if small else (128, 224)
    net = torchvision.models.resnet50(weights=None).to(DEVICE, memory_format=torch.channels_last)
    model = StageCheckpointed(net) if mode == "ckpt" else net
    model.train()
    gen = _batch_generator(seed)

    def make_batch(step):
        g = gen(step)
        x = torch.randn(batch, 3, hw, hw, generator=g, device=DEVICE).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (batch,), generator=g, device=DEVICE)
        return x, y

    def loss_fn(m, inputs):
        x, y = inputs
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = m(x)
        return F.cross_entropy(out.float(), y)

    def make_optimizer(params):
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)

    return model, make_batch, loss_fn, make_optimizer


# --------------------------------------------------------------------------- llama

def build_llama(mode, small, seed):
    from transformers import LlamaConfig, LlamaForCausalLM

    if small:
        dims = dict(num_hidden_layers=2, hidden_size=512, intermediate_size=1408, num_attention_heads=8, vocab_size=8000)
        batch, seq = 2, 256
    else:
        dims = dict(num_hidden_layers=8, hidden_size=2048, intermediate_size=5632, num_attention_heads=16, vocab_size=32000)
        batch, seq = 4, 2048
    config = LlamaConfig(**dims, num_key_value_heads=dims["num_attention_heads"],
                         max_position_embeddings=4096, use_cache=False, attn_implementation="sdpa")
    # Built directly in bf16 on the device (as from_pretrained(dtype=bf16) would): the
    # rotary inv_freq buffer is made in fp32 explicitly and stays fp32.
    prev_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(DEVICE):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(prev_dtype)
    model.train()
    if mode == "ckpt":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    vocab = dims["vocab_size"]
    gen = _batch_generator(seed)

    def make_batch(step):
        return torch.randint(0, vocab, (batch, seq), generator=gen(step), device=DEVICE)

    def loss_fn(m, ids):
        return m(input_ids=ids, labels=ids, use_cache=False).loss

    def make_optimizer(params):
        return torch.optim.AdamW(params, lr=1e-4)

    return model, make_batch, loss_fn, make_optimizer


# --------------------------------------------------------------------------- lora

LORA_RANK, LORA_ALPHA = 16, 32


class LoRALinear(nn.Module):
    """A frozen base weight (no bias) plus a trainable rank-r adapter:
    y = x W^T + (x A^T) B^T * (alpha / r); W as nn.Linear initialises it, A (r x in) as PEFT
    does (both from the seeded RNG), B (out x r) zero."""

    def __init__(self, d_in, d_out, rank=LORA_RANK, alpha=LORA_ALPHA, **dd):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_out, d_in, **dd), requires_grad=False)
        self.lora_a = nn.Parameter(torch.empty(rank, d_in, **dd))
        self.lora_b = nn.Parameter(torch.zeros(d_out, rank, **dd))
        self.scale = alpha / rank
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))

    def forward(self, x):
        return F.linear(x, self.weight) + F.linear(F.linear(x, self.lora_a), self.lora_b) * self.scale


def _stream_weights(model, names):
    """`stream` mode: the weights `names` of the model's blocks streamed by weight_stream, through
    a ring of $WEIGHT_STREAM_RING slots (default 3). The first $WEIGHT_STREAM_KEEP blocks
    (default 0) keep theirs resident, as layer-offload trainers' "blocks to swap" settings do
    to use the memory a budget leaves."""
    import weight_stream

    ring = int(os.environ.get("WEIGHT_STREAM_RING", "3"))
    keep = int(os.environ.get("WEIGHT_STREAM_KEEP", "0"))
    if not 0 <= keep <= len(model.blocks) - 2:
        raise ValueError(f"WEIGHT_STREAM_KEEP={keep}: between 0 and {len(model.blocks) - 2} (two blocks streamed at least)")
    model.weight_stream = weight_stream.WeightStream(model.blocks[keep:], names, ring)
    model.weight_stream.kept = keep


def build_lora(mode, small, seed):
    """The reference architecture with every block Linear a LoRALinear (rank 16, alpha 32);
    only the adapters train (embedding, LayerNorms, head and base weights frozen). Full shapes:
    d=6144, 48 heads, 44 blocks, vocab 32000, 4 x 4096 tokens: 12 d^2 44 + 2 vocab d =
    20,324,548,608 frozen bf16 weights (40.6 GB), 69,206,016 adapter parameters. `stream`
    is `ckpt` with the blocks' base weights streamed by weight_stream.WeightStream."""
    vocab, d, heads, layers, batch, seq = (8000, 512, 8, 4, 2, 256) if small else (32000, 6144, 48, 44, 4, 4096)
    model = Transformer(vocab, d, heads, layers, ckpt=(mode in ("ckpt", "stream")), linear=LoRALinear,
                        device=DEVICE, dtype=torch.bfloat16)
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith((".lora_a", ".lora_b")))
    model.train()
    if mode == "stream":
        _stream_weights(model, ("qkv", "proj", "fc1", "fc2"))
    make_batch, loss_fn = _next_token_io(vocab, batch, seq, seed)

    def make_optimizer(params):
        return torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-4)

    return model, make_batch, loss_fn, make_optimizer


# --------------------------------------------------------------------------- moe

class Expert(nn.Module):
    """A frozen GELU MLP expert (no biases)."""

    def __init__(self, d, f, **dd):
        super().__init__()
        self.fc1 = nn.Linear(d, f, bias=False, **dd)
        self.fc2 = nn.Linear(f, d, bias=False, **dd)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MoEBlock(nn.Module):
    """Pre-LN block: causal attention with LoRA projections, then a mixture of `experts`
    frozen GELU experts with expert-choice routing (Zhou et al., 2022): the router's softmax
    over experts scores every token, and each expert takes the n * capacity_factor / experts
    tokens that score it highest, weighted by their score. Every shape is fixed, nothing waits
    on the host, and the gathers and sums (index_select, index_add_) are deterministic under
    torch.use_deterministic_algorithms."""

    def __init__(self, d, heads, experts, f, capacity_factor, linear, **dd):
        super().__init__()
        self.heads = heads
        self.capacity_factor = capacity_factor
        self.ln1 = nn.LayerNorm(d, **dd)
        self.qkv = linear(d, 3 * d, **dd)
        self.proj = linear(d, d, **dd)
        self.ln2 = nn.LayerNorm(d, **dd)
        self.router = nn.Linear(d, experts, bias=False, **dd)
        self.experts = nn.ModuleList(Expert(d, f, **dd) for _ in range(experts))

    def forward(self, x):
        b, t, d = x.shape
        x = x + _attention(self, x)
        h = self.ln2(x).reshape(b * t, d)
        take = b * t * self.capacity_factor // len(self.experts)
        gate, idx = self.router(h).float().softmax(dim=-1).t().topk(take, dim=1)  # each (experts, take)
        out = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            out.index_add_(0, idx[e], expert(h.index_select(0, idx[e])) * gate[e, :, None].to(h.dtype))
        return x + out.view(b, t, d)


def build_moe(mode, small, seed):
    """A mixture-of-experts transformer fine-tuned with LoRA: attention projections are
    LoRALinear (rank 16, alpha 32); only the adapters train (experts, routers, LayerNorms,
    embedding and head frozen). Full shapes: d=4096, 32 heads, 18 blocks of 16 experts
    (d -> 8192 -> d, 64 MiB a weight), capacity factor 6 (each token goes to six experts on
    average), vocab 32000, 4 x 4096 tokens: 20,798,939,136 frozen bf16 weights (41.6 GB,
    38.7 GiB), 7,077,888 adapter parameters. Each expert works on 6/16 of the tokens, so a
    block's weights carry 0.41 times the GEMM work per byte that a dense block's do (the
    `lora` workload's): streamed whole, as layer-offload trainers stream, they keep the link
    busier than the forward pass's compute. (At a capacity factor of 3 the forward pass was
    too short for any streaming at 20 GiB: the weights it needs past what fits take longer on
    the link than its compute; docs/results.md.) `stream` is `ckpt` with each block's
    attention and expert weights streamed by weight_stream."""
    vocab, d, heads, layers, experts, f, capacity, batch, seq = (
        (8000, 512, 8, 4, 4, 1024, 2, 2, 256) if small else (32000, 4096, 32, 18, 16, 8192, 6, 4, 4096))
    dd = dict(device=DEVICE, dtype=torch.bfloat16)
    model = Transformer(vocab, d, heads, layers, ckpt=(mode in ("ckpt", "stream")),
                        block=lambda: MoEBlock(d, heads, experts, f, capacity, LoRALinear, **dd), **dd)
    for name, p in model.named_parameters():
        p.requires_grad_(name.endswith((".lora_a", ".lora_b")))
    model.train()
    if mode == "stream":
        _stream_weights(model, ("qkv", "proj") + tuple(f"experts.{e}.{n}" for e in range(experts) for n in ("fc1", "fc2")))
    make_batch, loss_fn = _next_token_io(vocab, batch, seq, seed)

    def make_optimizer(params):
        return torch.optim.AdamW([p for p in params if p.requires_grad], lr=1e-4)

    return model, make_batch, loss_fn, make_optimizer


# --------------------------------------------------------------------------- entry point

_BUILDERS = {"reference": build_reference, "convnet": build_convnet, "llama": build_llama, "lora": build_lora,
             "moe": build_moe}


def build(name, mode="plain", small=False, seed=0, data_seed=None):
    """Builds workload `name` in `mode`; returns (model, make_batch, loss_fn, make_optimizer).
    The weights come from `seed`, the batches from `data_seed` (default: `seed`)."""
    if name not in _BUILDERS:
        raise ValueError(f"unknown workload {name!r}; choose from {WORKLOADS}")
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {MODES}")
    if mode == "stream" and name not in ("lora", "moe"):
        raise ValueError(f"mode 'stream' (weight streaming) is only for the lora and moe workloads, not {name!r}")
    torch.manual_seed(seed)
    model, make_batch, loss_fn, make_optimizer = _BUILDERS[name](mode, small, seed if data_seed is None else data_seed)
    if mode == "save_on_cpu":
        inner = loss_fn

        def loss_fn(m, inputs):
            with torch.autograd.graph.save_on_cpu(pin_memory=True):
                return inner(m, inputs)

    return model, make_batch, loss_fn, make_optimizer
