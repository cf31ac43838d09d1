"""One unchanged training loop under a device-memory limit, measured from outside the allocator.

    python3 budget.py --workload hf_llama --steps 20 [--hog-to BYTES] [--managed] [--ckpt] --out run.json

The loop is what a user writes: forward, loss, backward, optimizer step; no offload_mark_step,
no empty_cache. A thread samples the device's used memory (cudaMemGetInfo through libcudart,
every --sample-ms) from the moment CUDA is initialised, before the model is built; the run
reports the highest rise above that baseline over each step. With --hog-to, another
allocation made in this process first leaves only that many bytes free (the GPU is then
"smaller than the model"). With --managed, every allocation comes from cudaMallocManaged
through a pluggable allocator (the anchor a user has today). Losses and a hash of the final
parameters say whether two runs are bitwise equal. With --ckpt the model is built with the
activation checkpointing its users would write (non-reentrant, per block or stage); a family
without a natural form of it (lstm, embed_cat) says so and exits with status 3.

Workload families (seeded, nothing downloaded):
  hf_llama      a Llama built from a transformers LlamaConfig (bf16 weights, fused AdamW)
  resnet50      torchvision ResNet-50 under bf16 autocast, SGD with momentum
  lstm          a 3-layer cuDNN LSTM language model, Adam
  embed_cat     an embedding bag of many tables joined by a many-input torch.cat, foreach Adam
  compiled_mlp  a torch.compile'd MLP, AdamW
  graphed_mlp   an MLP whose whole step (zeroing the gradients, forward, backward, capturable Adam) is captured once
                into a CUDA graph with torch.cuda.graph after three warm-up steps on a side
                stream, as PyTorch's documentation shows, and replayed every step
  hf_gpt2       a GPT-2 built from a transformers GPT2Config (fp32 weights, bf16 autocast, AdamW)
  hf_bert       a BERT masked-language model from a transformers BertConfig (15% of tokens masked)
  vit           torchvision ViT-B/16 under bf16 autocast, AdamW
  gru_amp       a 2-layer cuDNN GRU under fp16 autocast with a GradScaler (its step is the loop's)
  hf_t5         a T5 encoder-decoder from a transformers T5Config (fp32, relative attention bias, AdamW)
  unet          a diffusion-style UNet (GroupNorm, SiLU, skip connections joined by torch.cat, self-
                attention at the lowest resolution, a timestep embedding) under bf16 autocast, AdamW
  compiled_gpt2 a transformers GPT-2 under torch.compile (default mode), bf16 autocast, AdamW
  ro_mlp        an MLP under torch.compile(mode="reduce-overhead"): inductor's CUDA graphs, AdamW
  sparse_embed  large embedding tables with sparse gradients (SparseAdam) under a dense MLP (Adam)
  accum         a PyTorch TransformerEncoder language model with tied embeddings, gradients accumulated
                over 4 micro-batches a step, AdamW
  hf_mixtral    a Mixtral (8 experts, 2 per token) from a transformers MixtralConfig (bf16 weights, AdamW):
                the experts' tensors change size with the routing every step
  convnext      torchvision ConvNeXt-T (depthwise 7x7 convolutions, LayerNorm, stochastic depth) under bf16
                autocast, AdamW
  varlen_llama  hf_llama with a sequence length drawn from four every step: no two steps need be alike
  gnn           a message-passing network on random graphs: index_select gathers and index_add_ scatters
                over irregular indices, a readout per graph, AdamW
  launches      the hooks' cost per launch: 2000 in-place adds on a small tensor a step, no allocation
  allocs        the hooks' cost per allocation: 2000 1 MiB tensors made and freed a step, no launch
"""

import argparse
import ctypes
import hashlib
import json
import os
import sys
import threading
import time
import traceback

import torch
import torch.nn as nn
import torch.nn.functional as F


def log(*a):
    print("[budget]", *a, file=sys.stderr, flush=True)


class Sampler(threading.Thread):
    """The device's used bytes (total - free) every `period` s, through the runtime directly
    (ctypes releases the GIL for the call), with the highest value since the last take()."""

    def __init__(self, period):
        super().__init__(daemon=True)
        self.rt = ctypes.CDLL("libcudart.so.13") if _has("libcudart.so.13") else _torch_cudart()
        self.rt.cudaMemGetInfo.argtypes = [ctypes.POINTER(ctypes.c_size_t)] * 2
        self.period = period
        self.peak = 0
        self.samples = 0
        self.stop = False
        self.lock = threading.Lock()

    def used(self):
        f, t = ctypes.c_size_t(), ctypes.c_size_t()
        if self.rt.cudaMemGetInfo(ctypes.byref(f), ctypes.byref(t)) != 0:
            return 0
        return t.value - f.value

    def run(self):
        while not self.stop:
            u = self.used()
            with self.lock:
                self.peak = max(self.peak, u)
                self.samples += 1
            time.sleep(self.period)

    def take(self):
        u = self.used()
        with self.lock:
            p, self.peak = max(self.peak, u), u
        return p


def _has(name):
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False


def _torch_cudart():
    import glob
    for p in glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcudart.so*")):
        return ctypes.CDLL(p)
    raise OSError("libcudart not found")


MANAGED_SRC = r"""
#include <cuda_runtime.h>
#include <sys/types.h>
extern "C" void* mm_malloc(ssize_t size, int device, cudaStream_t s) {
  void* p = nullptr;
  if (cudaMallocManaged(&p, size, cudaMemAttachGlobal) != cudaSuccess) return nullptr;
  return p;
}
extern "C" void mm_free(void* p, ssize_t size, int device, cudaStream_t s) {
  cudaStreamSynchronize(s);
  cudaFree(p);
}
"""


def managed_allocator(workdir):
    src, so = os.path.join(workdir, "managed.cpp"), os.path.join(workdir, "libmanaged_alloc.so")
    if not os.path.exists(so):
        with open(src, "w") as f:
            f.write(MANAGED_SRC)
        cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        rc = os.system(f"g++ -O2 -shared -fPIC -I{cuda}/include {src} -o {so} -L{cuda}/lib64 -lcudart")
        if rc != 0:
            raise RuntimeError("building the managed-memory allocator failed")
    return torch.cuda.memory.CUDAPluggableAllocator(so, "mm_malloc", "mm_free")


# ------------------------------------------------------------------------------ workloads

from budget_models import (Checkpointed, EmbeddingCat, RecurrentLM, UNet, FAMILIES,  # noqa: E402
                           hf_for_training, mlp_blocks)


def build(name, seed, scale, ckpt=False):
    torch.manual_seed(seed)
    if ckpt and name in ("lstm", "embed_cat", "launches", "allocs", "graphed_mlp", "gru_amp", "sparse_embed", "ro_mlp", "gnn"):
        raise NoCheckpointing(name)
    dev = "cuda"
    gen = torch.Generator(device=dev)

    def g(step):
        gen.manual_seed(seed * 1_000_003 + step)
        return gen

    if name in FAMILIES:  # built in budget_models.py
        return FAMILIES[name](scale, dev, g, ckpt)

    def classify_step(model, batch, res):
        """A channels-last image classifier's step under bf16 autocast, on 1000 classes."""
        def step_fn(k):
            x = torch.randn(batch, 3, res, res, generator=g(k), device=dev).to(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (batch,), generator=g(k), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return F.cross_entropy(model(x), y)
        return step_fn

    if name == "hf_llama":
        from transformers import LlamaConfig, LlamaForCausalLM
        layers, d, batch, seq = {"small": (4, 1024, 4, 1024), "large": (12, 2048, 8, 2048)}[scale]
        cfg = LlamaConfig(vocab_size=32000, hidden_size=d, intermediate_size=int(d * 2.6875) // 64 * 64,
                          num_hidden_layers=layers, num_attention_heads=d // 128, num_key_value_heads=d // 128,
                          max_position_embeddings=seq, attn_implementation="sdpa")
        model = LlamaForCausalLM(cfg).to(dev, torch.bfloat16)
        hf_for_training(model, ckpt)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step_fn(k):
            tok = torch.randint(0, 32000, (batch, seq + 1), generator=g(k), device=dev)
            out = model(input_ids=tok[:, :-1], labels=tok[:, 1:])
            return out.loss
        return model, opt, step_fn
    if name == "resnet50":
        import torchvision
        batch, res = {"small": (32, 160), "large": (128, 224)}[scale]
        model = torchvision.models.resnet50(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
        if ckpt:
            for stage in ("layer1", "layer2", "layer3", "layer4"):
                setattr(model, stage, Checkpointed(getattr(model, stage)))
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

        return model, opt, classify_step(model, batch, res)
    if name == "lstm":
        vocab, d, batch, seq = {"small": (8000, 512, 32, 256), "large": (32000, 1536, 64, 512)}[scale]
        model = RecurrentLM(vocab, d, lambda: nn.LSTM(d, d, num_layers=3, batch_first=True)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step_fn(k):
            tok = torch.randint(0, vocab, (batch, seq + 1), generator=g(k), device=dev)
            return F.cross_entropy(model(tok[:, :-1]).reshape(-1, vocab), tok[:, 1:].reshape(-1))
        return model, opt, step_fn
    if name == "embed_cat":
        tables, rows, d, batch = {"small": (64, 20000, 64, 4096), "large": (96, 200000, 128, 16384)}[scale]
        model = EmbeddingCat(tables, rows, d).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True)

        def step_fn(k):
            idx = torch.randint(0, rows, (batch, tables), generator=g(k), device=dev)
            y = torch.rand(batch, generator=g(k), device=dev)
            return F.binary_cross_entropy_with_logits(model(idx), y)
        return model, opt, step_fn
    if name == "compiled_mlp":
        d, depth, batch = {"small": (2048, 8, 4096), "large": (4096, 16, 16384)}[scale]
        model = mlp_blocks(d, depth).to(dev)
        if ckpt:
            model = nn.Sequential(*[Checkpointed(blk) for blk in model])
        cmodel = torch.compile(model)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step_fn(k):
            x = torch.randn(batch, d, generator=g(k), device=dev)
            return cmodel(x).float().pow(2).mean()
        return model, opt, step_fn
    if name in ("hf_gpt2", "hf_bert", "compiled_gpt2"):
        import transformers
        layers, d, batch, seq = {"small": (4, 768, 8, 512), "large": (12, 1536, 16, 1024)}[scale]
        if name != "hf_bert":
            cfg = transformers.GPT2Config(vocab_size=32000, n_positions=seq, n_embd=d, n_layer=layers,
                                          n_head=d // 64, attn_implementation="sdpa")
            model = transformers.GPT2LMHeadModel(cfg).to(dev)
        else:
            cfg = transformers.BertConfig(vocab_size=32000, hidden_size=d, num_hidden_layers=layers,
                                          num_attention_heads=d // 64, intermediate_size=4 * d,
                                          max_position_embeddings=seq, attn_implementation="sdpa")
            model = transformers.BertForMaskedLM(cfg).to(dev)
        hf_for_training(model, ckpt)
        fwd = torch.compile(model) if name == "compiled_gpt2" else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step_fn(k):
            tok = torch.randint(0, 32000, (batch, seq), generator=g(k), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                if name != "hf_bert":
                    return fwd(input_ids=tok, labels=tok).loss
                masked = torch.rand(batch, seq, generator=g(k), device=dev) < 0.15
                labels = torch.where(masked, tok, torch.full_like(tok, -100))
                return model(input_ids=torch.where(masked, torch.full_like(tok, 4), tok), labels=labels).loss
        return model, opt, step_fn
    if name == "hf_mixtral":
        # Routed experts: how many tokens each expert takes, and so the sizes of its tensors,
        # change with the routing every step.
        from transformers import MixtralConfig, MixtralForCausalLM
        layers, d, batch, seq = {"small": (4, 768, 4, 1024), "large": (8, 1536, 8, 2048)}[scale]
        cfg = MixtralConfig(vocab_size=32000, hidden_size=d, intermediate_size=2 * d, num_hidden_layers=layers,
                            num_attention_heads=d // 64, num_key_value_heads=d // 128, num_local_experts=8,
                            num_experts_per_tok=2, max_position_embeddings=seq, attn_implementation="sdpa")
        model = MixtralForCausalLM(cfg).to(dev, torch.bfloat16)
        hf_for_training(model, ckpt)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step_fn(k):
            tok = torch.randint(0, 32000, (batch, seq + 1), generator=g(k), device=dev)
            return model(input_ids=tok[:, :-1], labels=tok[:, 1:]).loss
        return model, opt, step_fn
    if name == "convnext":
        import torchvision
        batch, res = {"small": (32, 160), "large": (96, 224)}[scale]
        model = torchvision.models.convnext_tiny(num_classes=1000).to(dev).to(memory_format=torch.channels_last)
        if ckpt:
            for i in (1, 3, 5, 7):  # the four stages (the others are the stem and downsamplers)
                model.features[i] = Checkpointed(model.features[i])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        return model, opt, classify_step(model, batch, res)
    if name == "hf_t5":
        import transformers
        layers, d, batch, seq = {"small": (4, 512, 16, 256), "large": (12, 1024, 32, 512)}[scale]
        cfg = transformers.T5Config(vocab_size=32000, d_model=d, d_kv=64, d_ff=4 * d, num_layers=layers,
                                    num_decoder_layers=layers, num_heads=d // 64, dropout_rate=0.0)
        cfg.decoder_start_token_id = cfg.pad_token_id = 0  # not every transformers sets them
        model = transformers.T5ForConditionalGeneration(cfg).to(dev)
        hf_for_training(model, ckpt)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step_fn(k):
            src = torch.randint(0, 32000, (batch, seq), generator=g(k), device=dev)
            tgt = torch.randint(0, 32000, (batch, seq // 2), generator=g(k), device=dev)
            start = torch.zeros_like(tgt[:, :1])  # the labels shifted right, as T5 trains
            return model(input_ids=src, decoder_input_ids=torch.cat([start, tgt[:, :-1]], dim=1), labels=tgt).loss
        return model, opt, step_fn
    if name == "unet":
        ch, batch, res = {"small": (64, 16, 64), "large": (128, 32, 128)}[scale]
        model = UNet(ch).to(dev)
        if ckpt:
            for mods in (model.down, model.up):
                for i, blk in enumerate(mods):
                    mods[i] = Checkpointed(blk)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step_fn(k):
            x0 = torch.randn(batch, 3, res, res, generator=g(k), device=dev)
            noise = torch.randn(batch, 3, res, res, generator=g(k), device=dev)
            t = torch.randint(0, 1000, (batch,), generator=g(k), device=dev).float()
            a = (1 - t / 1000).view(-1, 1, 1, 1)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                pred = model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t)
            return F.mse_loss(pred.float(), noise)
        return model, opt, step_fn
    if name == "vit":
        import torchvision
        batch = {"small": 32, "large": 128}[scale]
        model = torchvision.models.vit_b_16(num_classes=1000).to(dev)
        if ckpt:
            model.encoder.layers = nn.Sequential(*[Checkpointed(blk) for blk in model.encoder.layers])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step_fn(k):
            x = torch.randn(batch, 3, 224, 224, generator=g(k), device=dev)
            y = torch.randint(0, 1000, (batch,), generator=g(k), device=dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return F.cross_entropy(model(x), y)
        return model, opt, step_fn
    if name == "gru_amp":
        vocab, d, batch, seq = {"small": (8000, 512, 32, 256), "large": (32000, 1536, 64, 512)}[scale]
        model = RecurrentLM(vocab, d, lambda: nn.GRU(d, d, num_layers=2, batch_first=True)).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        scaler = torch.amp.GradScaler("cuda")

        def step_fn(k):
            tok = torch.randint(0, vocab, (batch, seq + 1), generator=g(k), device=dev)
            with torch.autocast("cuda", dtype=torch.float16):
                loss = F.cross_entropy(model(tok[:, :-1]).reshape(-1, vocab).float(), tok[:, 1:].reshape(-1))
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
        return model, None, step_fn
    if name == "graphed_mlp":
        d, depth, batch = {"small": (2048, 8, 4096), "large": (4096, 12, 16384)}[scale]
        model = mlp_blocks(d, depth).to(dev)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4, capturable=True)
        static_x = torch.zeros(batch, d, device=dev)

        def whole_step():  # the gradients live across steps, zeroed in the graph (not the graph's memory)
            opt.zero_grad(set_to_none=False)
            loss = model(static_x).float().pow(2).mean()
            loss.backward()
            opt.step()
            return loss
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: the gradients and the optimizer's state exist before the capture
            for k in range(3):
                static_x.copy_(torch.randn(batch, d, generator=g(10_000 + k), device=dev))
                whole_step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        grads_before = [p.grad.data_ptr() for p in model.parameters()]
        with torch.cuda.graph(graph):
            static_loss = whole_step()
        moved = sum(p.grad.data_ptr() != b for p, b in zip(model.parameters(), grads_before))
        log(f"graphed_mlp: the capture gave {moved} of {len(grads_before)} gradients new memory")

        def step_fn(k):
            static_x.copy_(torch.randn(batch, d, generator=g(k), device=dev))
            graph.replay()
            return static_loss
        return model, None, step_fn
    if name == "ro_mlp":
        d, depth, batch = {"small": (2048, 8, 4096), "large": (4096, 12, 16384)}[scale]
        model = mlp_blocks(d, depth).to(dev)
        cmodel = torch.compile(model, mode="reduce-overhead")
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step_fn(k):
            x = torch.randn(batch, d, generator=g(k), device=dev)
            return cmodel(x).float().pow(2).mean()
        return model, opt, step_fn
    if name == "sparse_embed":
        tables, rows, d, batch = {"small": (8, 200000, 64, 8192), "large": (16, 2000000, 128, 32768)}[scale]
        model = EmbeddingCat(tables, rows, d, sparse=True).to(dev)
        sparse_opt = torch.optim.SparseAdam(list(model.embs.parameters()), lr=1e-3)
        dense_opt = torch.optim.Adam(model.mlp.parameters(), lr=1e-3)

        def step_fn(k):  # two optimizers: the whole step here
            idx = torch.randint(0, rows, (batch, tables), generator=g(k), device=dev)
            y = torch.rand(batch, generator=g(k), device=dev)
            loss = F.binary_cross_entropy_with_logits(model(idx), y)
            loss.backward()
            sparse_opt.step()
            dense_opt.step()
            model.zero_grad(set_to_none=True)
            return loss.detach()
        return model, None, step_fn
    if name == "accum":
        vocab, d, layers, batch, seq, micro = {"small": (16000, 512, 4, 8, 512, 4),
                                               "large": (32000, 1536, 12, 16, 1024, 4)}[scale]

        class TiedLM(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(vocab, d)
                self.blocks = nn.ModuleList(
                    nn.TransformerEncoderLayer(d, d // 64, 4 * d, dropout=0.0, batch_first=True, norm_first=True)
                    for _ in range(layers))
                self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)

            def forward(self, tok):
                h = self.emb(tok)
                for blk in self.blocks:
                    h = blk(h, src_mask=self.mask, is_causal=True)
                return h @ self.emb.weight.t()  # the head tied to the embedding
        model = TiedLM().to(dev)
        if ckpt:
            model.blocks = nn.ModuleList(Checkpointed(blk) for blk in model.blocks)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step_fn(k):  # gradients accumulated over the micro-batches: the whole step here
            total = torch.zeros((), device=dev)
            for m in range(micro):
                tok = torch.randint(0, vocab, (batch, seq + 1), generator=g(k * micro + m), device=dev)
                loss = F.cross_entropy(model(tok[:, :-1]).reshape(-1, vocab), tok[:, 1:].reshape(-1)) / micro
                loss.backward()
                total += loss.detach()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return total
        return model, None, step_fn
    if name in ("launches", "allocs"):  # host-bound by design: what each hook costs, per operation
        # Deterministic mode fills every new tensor (a launch each): not for `allocs`.
        torch.utils.deterministic.fill_uninitialized_memory = name != "allocs"
        model = nn.Module()
        model.w = nn.Parameter(torch.ones(16, device=dev))
        buf = torch.zeros(16, device=dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.0)

        def step_fn(k):
            with torch.no_grad():
                for _ in range(2000):
                    if name == "launches":
                        buf.add_(1.0)
                    else:
                        torch.empty(1 << 18, device=dev)
            return (model.w * 1.0).sum()
        return model, opt, step_fn
    # The benchmark workloads (workloads.py), in their plain mode, or checkpointed with `:ckpt`.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import workloads
    base, _, mode = name.partition(":")
    mode = "ckpt" if ckpt else mode
    if base not in workloads.WORKLOADS:
        raise SystemExit(f"unknown workload {name}")
    model, make_batch, loss_fn, make_optimizer = workloads.build(base, mode or "plain", scale == "small", seed)
    opt = make_optimizer([p for p in model.parameters() if p.requires_grad])

    def step_fn(k):
        return loss_fn(model, make_batch(k))
    return model, opt, step_fn


class NoCheckpointing(Exception):
    pass


def offload_stats(key="residency"):
    """liboffload's counters under `key` (all of them for None) when it is preloaded, else None."""
    stats = getattr(ctypes.CDLL(None), "offload_stats_json", None)
    if not stats:
        return None
    stats.argtypes, stats.restype = [ctypes.c_char_p, ctypes.c_size_t], ctypes.c_int
    buf = ctypes.create_string_buffer(1 << 20)
    n = stats(buf, len(buf))
    if n <= 0:
        return None
    stats = json.loads(buf.raw[:n].decode("utf-8", "replace"))
    return stats if key is None else stats.get(key)


def param_hash(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().flatten().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True, help="a family above, or a workloads.py name (name:ckpt)")
    ap.add_argument("--scale", default="small", choices=("small", "large"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hog-to", type=int, default=0, help="leave only this many bytes free")
    ap.add_argument("--managed", action="store_true")
    ap.add_argument("--ckpt", action="store_true", help="the model with activation checkpointing")
    ap.add_argument("--sample-ms", type=float, default=2.0, help="0: no sampling (for timing)")
    ap.add_argument("--no-shim-stats", action="store_true",
                    help="do not read the shim's counters each step (they cost it a pump): for timing")
    ap.add_argument("--ab-pause", action="store_true",
                    help="under the shim without a budget: every other step with observation paused "
                         "(offload_pause_observation), an A/B of watching inside one process")
    ap.add_argument("--out", required=True)
    ap.add_argument("--workdir", default="/tmp")
    a = ap.parse_args()

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    # Attention's fused backward kernels accumulate with atomics: the math backend is the one that
    # gives a run identical to itself, which a bitwise comparison needs.
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    torch.backends.cuda.enable_cudnn_sdp(False)
    if a.managed:
        torch.cuda.memory.change_current_allocator(managed_allocator(a.workdir))
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the context, before the model
    torch.cuda.synchronize()
    sampler = Sampler(a.sample_ms / 1000)
    if a.hog_to:
        # cudaMalloc, outside every allocator PyTorch or liboffload has: device memory simply gone.
        free, _ = torch.cuda.mem_get_info()
        if free > a.hog_to:
            p = ctypes.c_void_p()
            sampler.rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
            if sampler.rt.cudaMalloc(ctypes.byref(p), free - a.hog_to) != 0:
                raise SystemExit("could not hold the device memory")
    torch.cuda.synchronize()
    base = sampler.used()
    if a.sample_ms > 0:  # 0: no sampling thread at all (it takes the GIL every sample)
        sampler.start()
    res = {"workload": a.workload, "scale": a.scale, "steps": a.steps, "base_used": base, "hog_to": a.hog_to,
           "managed": a.managed, "ckpt": a.ckpt, "preload": os.environ.get("LD_PRELOAD", ""),
           "budget_env": os.environ.get("OFFLOAD_DEVICE_BUDGET", ""), "losses": [], "step_ms": [],
           "step_peak_rise": [], "error": None}
    try:
        try:
            model, opt, step_fn = build(a.workload, a.seed, a.scale, a.ckpt)
        except NoCheckpointing:
            log(f"{a.workload} has no natural form of activation checkpointing")
            sys.exit(3)
        pause = getattr(ctypes.CDLL(None), "offload_pause_observation", None) if a.ab_pause else None
        if a.ab_pause and not pause:
            raise SystemExit("--ab-pause needs liboffload preloaded")
        for k in range(a.steps):
            if pause:  # odd steps paused: both halves in the same process, interleaved
                pause(k % 2)
            t0 = time.perf_counter()
            loss = step_fn(k)
            if opt is not None:  # None: step_fn ran the whole step (a graph's replay)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            res["losses"].append(loss.item())  # the host waits for the step here, as a user's log would
            torch.cuda.synchronize()
            res["step_ms"].append((time.perf_counter() - t0) * 1e3)
            if pause:
                pause(0)
                res.setdefault("paused_steps", []).append(k % 2 == 1)
            res["step_peak_rise"].append(sampler.take() - base)
            counters = None if a.no_shim_stats else offload_stats()
            if counters is not None:  # every step's, to see where a step's time goes
                res.setdefault("offload_steps", []).append(counters)
            if k == 2:  # the counters at the start of the steady steps (budget_report.py's from the fourth)
                res["offload_at_3"] = counters
            log(f"{a.workload} step {k}: loss {res['losses'][-1]:.6f} {res['step_ms'][-1]:.1f} ms "
                f"peak +{res['step_peak_rise'][-1] / 2**30:.2f} GiB")
        res["param_hash"] = param_hash(model)
    except Exception as e:  # an out-of-memory is a result here, not a crash
        res["error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        log("error:", res["error"])
        traceback.print_exc()
    sampler.stop = True
    res["offload"] = offload_stats()
    shim = offload_stats(None)
    if shim and "counters" in shim:  # not in pass-through (OFFLOAD_DISABLE=1)
        c = shim["counters"]
        res["shim_mode"] = {"observe": shim.get("observe"), "telemetry": shim.get("telemetry"),
                            "scanned": c["kernels"], "unscanned": c.get("unscanned_launches"), "allocs": c.get("allocs"),
                            "graph_launches": c.get("graph_launches")}
    res["samples"] = sampler.samples
    res["peak_rise"] = max(res["step_peak_rise"], default=0)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
