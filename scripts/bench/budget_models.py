"""The model families' building blocks for budget.py, and the families built as functions.

Each family function takes (scale, dev, g) and returns (model, optimizer, step_fn): `g(step)` is
a generator seeded for that step, and step_fn(k) returns the step's loss (or runs the whole step
and returns its loss when the optimizer is None).
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

class RecurrentLM(nn.Module):
    """Embedding, the recurrent layers `make_rnn()` builds, and a head over the vocabulary (made in
    that order: the seeded initialisation is the same as the families had before)."""

    def __init__(self, vocab, d, make_rnn):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = make_rnn()
        self.head = nn.Linear(d, vocab)

    def forward(self, x):
        return self.head(self.rnn(self.emb(x))[0])


class UNet(nn.Module):
    """Down and up paths of residual blocks (GroupNorm, SiLU, the timestep added), skips joined by
    torch.cat, self-attention over the lowest resolution's positions."""

    class Block(nn.Module):
        def __init__(self, cin, cout, tdim):
            super().__init__()
            self.n1, self.c1 = nn.GroupNorm(8, cin), nn.Conv2d(cin, cout, 3, padding=1)
            self.t = nn.Linear(tdim, cout)
            self.n2, self.c2 = nn.GroupNorm(8, cout), nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x, temb):
            h = self.c1(F.silu(self.n1(x))) + self.t(temb)[:, :, None, None]
            return self.skip(x) + self.c2(F.silu(self.n2(h)))

    def __init__(self, ch, mults=(1, 2, 4), tdim=256):
        super().__init__()
        self.tdim = tdim
        self.temb = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        chans = [ch * m for m in mults]
        self.down, self.pool, c = nn.ModuleList(), nn.ModuleList(), ch
        for co in chans:
            self.down.append(UNet.Block(c, co, tdim))
            self.pool.append(nn.Conv2d(co, co, 3, stride=2, padding=1))
            c = co
        self.mid = UNet.Block(c, c, tdim)
        self.attn = nn.MultiheadAttention(c, 8, batch_first=True)
        self.up = nn.ModuleList()
        for co in reversed(chans):
            self.up.append(UNet.Block(c + co, co, tdim))
            c = co
        self.out = nn.Sequential(nn.GroupNorm(8, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

    def forward(self, x, t):
        half = self.tdim // 2
        freqs = torch.exp(-torch.arange(half, device=x.device) * (9.21 / half))
        temb = self.temb(torch.cat([torch.sin(t[:, None] * freqs), torch.cos(t[:, None] * freqs)], dim=1))
        h, skips = self.inp(x), []
        for blk, pool in zip(self.down, self.pool):
            h = blk(h, temb)
            skips.append(h)
            h = pool(h)
        h = self.mid(h, temb)
        b, c, hh, ww = h.shape
        seq = h.flatten(2).transpose(1, 2)
        h = h + self.attn(seq, seq, seq, need_weights=False)[0].transpose(1, 2).reshape(b, c, hh, ww)
        for blk in self.up:
            b, c, hh, ww = h.shape  # nearest 2x upsampling whose backward is a sum (interpolate's uses atomics)
            h = h[:, :, :, None, :, None].expand(b, c, hh, 2, ww, 2).reshape(b, c, 2 * hh, 2 * ww)
            h = blk(torch.cat([h, skips.pop()], dim=1), temb)
        return self.out(h)


class EmbeddingCat(nn.Module):
    """`tables` embeddings (one index column each) joined by a many-input torch.cat under an MLP."""

    def __init__(self, tables, rows, d, sparse=False):
        super().__init__()
        self.embs = nn.ModuleList(nn.Embedding(rows, d, sparse=sparse) for _ in range(tables))
        self.mlp = nn.Sequential(nn.Linear(tables * d, 1024), nn.ReLU(), nn.Linear(1024, 1))

    def forward(self, idx):
        return self.mlp(torch.cat([e(idx[:, i]) for i, e in enumerate(self.embs)], dim=1)).squeeze(1)


def mlp_blocks(d, depth):
    """`depth` blocks of Linear, GELU, Linear and LayerNorm at width `d` (4x inside)."""
    return nn.Sequential(*[nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d), nn.LayerNorm(d))
                           for _ in range(depth)])


class Checkpointed(nn.Module):
    """`inner` under non-reentrant activation checkpointing."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *inputs, **kwargs):
        from torch.utils.checkpoint import checkpoint
        return checkpoint(self.inner, *inputs, use_reentrant=False, **kwargs)


def hf_for_training(model, ckpt):
    """A transformers model in training mode, with the checkpointing its users turn on (non-reentrant)."""
    if ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    return model


def varlen_llama(scale, dev, g, ckpt=False):
    """A Llama from a transformers config whose sequence length changes every step (drawn from four
    lengths by the step's seed), as batches padded to their longest sample are: every step's
    tensors have other sizes than the step before's."""
    from transformers import LlamaConfig, LlamaForCausalLM
    layers, d, batch, seqs = {"small": (4, 1024, 4, (256, 512, 768, 1024)),
                              "large": (12, 2048, 8, (512, 1024, 1536, 2048))}[scale]
    cfg = LlamaConfig(vocab_size=32000, hidden_size=d, intermediate_size=int(d * 2.6875) // 64 * 64,
                      num_hidden_layers=layers, num_attention_heads=d // 128, num_key_value_heads=d // 128,
                      max_position_embeddings=max(seqs), attn_implementation="sdpa")
    model = hf_for_training(LlamaForCausalLM(cfg).to(dev, torch.bfloat16), ckpt)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step_fn(k):
        seq = seqs[int(torch.randint(0, len(seqs), (1,), generator=torch.Generator().manual_seed(k)))]
        tok = torch.randint(0, 32000, (batch, seq + 1), generator=g(k), device=dev)
        return model(input_ids=tok[:, :-1], labels=tok[:, 1:]).loss
    return model, opt, step_fn


class MessagePassing(nn.Module):
    """Graph layers that gather each edge's source features (index_select), transform them with
    the edge's features, and sum them into the destinations (index_add_), then a residual MLP and
    LayerNorm; a per-graph readout by index_add_ over the nodes' graph ids."""

    class Layer(nn.Module):
        def __init__(self, d, de):
            super().__init__()
            self.msg = nn.Linear(2 * d + de, d)
            self.upd = nn.Sequential(nn.Linear(2 * d, 2 * d), nn.SiLU(), nn.Linear(2 * d, d))
            self.norm = nn.LayerNorm(d)

        def forward(self, h, src, dst, e):
            m = F.silu(self.msg(torch.cat([h.index_select(0, src), h.index_select(0, dst), e], dim=1)))
            agg = torch.zeros_like(h).index_add_(0, dst, m)
            return self.norm(h + self.upd(torch.cat([h, agg], dim=1)))

    def __init__(self, din, d, de, layers, classes):
        super().__init__()
        self.inp = nn.Linear(din, d)
        self.layers = nn.ModuleList(MessagePassing.Layer(d, de) for _ in range(layers))
        self.out = nn.Linear(d, classes)

    def forward(self, x, src, dst, e, graph, graphs):
        h = self.inp(x)
        for layer in self.layers:
            h = layer(h, src, dst, e)
        pooled = torch.zeros(graphs, h.shape[1], device=h.device, dtype=h.dtype).index_add_(0, graph, h)
        return self.out(pooled)


def gnn(scale, dev, g, ckpt=False):
    """A message-passing network on a batch of random graphs (a new batch each step, its edge
    count fixed), graph classification, AdamW: gathers and scatter-adds over irregular indices."""
    nodes, edges, graphs, din, d, de, layers = {"small": (200_000, 1_600_000, 512, 64, 128, 16, 4),
                                                "large": (1_000_000, 8_000_000, 2048, 128, 256, 32, 6)}[scale]
    model = MessagePassing(din, d, de, layers, 16).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step_fn(k):
        x = torch.randn(nodes, din, generator=g(k), device=dev)
        src = torch.randint(0, nodes, (edges,), generator=g(k), device=dev)
        dst = torch.randint(0, nodes, (edges,), generator=g(k), device=dev)
        e = torch.randn(edges, de, generator=g(k), device=dev)
        graph = torch.sort(torch.randint(0, graphs, (nodes,), generator=g(k), device=dev)).values
        y = torch.randint(0, 16, (graphs,), generator=g(k), device=dev)
        return F.cross_entropy(model(x, src, dst, e, graph, graphs), y)
    return model, opt, step_fn


FAMILIES = {"varlen_llama": varlen_llama, "gnn": gnn}
