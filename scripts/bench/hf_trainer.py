#!/usr/bin/env python3
"""A Hugging Face Trainer run of a Llama built from a config (no download), for checking
liboffload's Trainer callback: prints `RESULT <json>` with every logged loss (as hex floats),
a SHA-256 of the final parameters, the peak of device memory the driver counted in use
(sampled every 2 ms, less what was in use before the model was built) and the shim's step count.

    python3 hf_trainer.py [--steps 20] [--callback] [--profile FILE]

--callback adds liboffload.integrations.hf.OffloadCallback. --profile FILE profiles one more
step with torch.profiler after training and writes its Chrome trace there, the shim's copies
named by liboffload.profiler; RESULT then says how many were named.
Deterministic (full_determinism): two runs with the same settings give the same bytes.
"""

import argparse
import hashlib
import json
import os
import sys
import tempfile
import threading
import time

import torch
from torch.utils.data import Dataset
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


class Tokens(Dataset):
    """Random token sequences, the same on every run."""

    def __init__(self, n, seq, vocab):
        g = torch.Generator().manual_seed(1234)
        self.ids = torch.randint(0, vocab, (n, seq), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def sample_used(stop, out):
    """The most device memory in use, every 2 ms, until `stop` is set."""
    free, total = torch.cuda.mem_get_info()
    out["peak"] = total - free
    while not stop.is_set():
        free, total = torch.cuda.mem_get_info()
        out["peak"] = max(out["peak"], total - free)
        time.sleep(0.002)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--callback", action="store_true")
    ap.add_argument("--profile", default="")
    a = ap.parse_args()
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    used_before = total - free
    stop, sampled = threading.Event(), {}
    sampler = threading.Thread(target=sample_used, args=(stop, sampled), daemon=True)
    sampler.start()

    cfg = LlamaConfig(vocab_size=32000, hidden_size=1024, intermediate_size=4096, num_hidden_layers=8,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=1024)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    callbacks = []
    if a.callback:
        from liboffload.integrations.hf import OffloadCallback
        callbacks.append(OffloadCallback())
    with tempfile.TemporaryDirectory() as out_dir:
        args = TrainingArguments(output_dir=out_dir, max_steps=a.steps, per_device_train_batch_size=8,
                                 learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to=[],
                                 full_determinism=True, seed=0, dataloader_num_workers=0,
                                 disable_tqdm=True)
        trainer = Trainer(model=model, args=args, train_dataset=Tokens(8 * a.steps, 512, cfg.vocab_size),
                          callbacks=callbacks)
        t0 = time.perf_counter()
        trainer.train()
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
    stop.set()
    sampler.join()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().float().cpu().numpy().tobytes())
    result = {"steps": a.steps, "callback": a.callback, "losses": losses,
              "losses_hex": [float.hex(float(v)) for v in losses], "param_sha256": h.hexdigest(),
              "device_used_peak_bytes": sampled["peak"] - used_before, "seconds": seconds}
    import liboffload
    if liboffload.loaded():
        st = liboffload.stats()
        result["shim"] = {"steps": st.get("steps"), "step_detection": st.get("step_detection"),
                          "memory": liboffload.memory_stats()}
    if a.profile:
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        batch = Tokens(8, 512, cfg.vocab_size).ids[:8].cuda()
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch.profiler.profile(activities=acts) as prof:
            for _ in range(2):
                loss = model(input_ids=batch, labels=batch).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
            torch.cuda.synchronize()
        import liboffload.profiler
        result["profile"] = {"copy_streams": sorted(liboffload.profiler.copy_stream_ids()),
                             "named": liboffload.profiler.export_chrome_trace(prof, a.profile)}
        with open(a.profile) as f:
            ev = json.load(f)["traceEvents"]
        result["profile"]["memcpy"] = sum(1 for e in ev if e.get("cat") == "gpu_memcpy")
        result["profile"]["kernels"] = sum(1 for e in ev if e.get("cat") == "kernel")
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    sys.exit(main())
