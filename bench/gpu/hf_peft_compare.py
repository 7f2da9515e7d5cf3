#!/usr/bin/env python3
"""Hugging Face transformers (+ PEFT) on the same shape ftexec runs: tokens/s and peak memory.

Usage (GPU machine with torch 2.x + CUDA, transformers, peft; no download: the model is built from
the config with random weights, as ftexec does):
  python3 bench/gpu/hf_peft_compare.py --config configs/models/llama-3.2-1b.json --method lora \
      --seq-len 2048 --micro-batch 4 --steps 20 --warmup 3 --precision bf16 --out hf_lora.json

Matches ftexec's run: synthetic uniform tokens, AdamW (lr 1e-4, no weight decay), gradient clipping
at 1.0, SDPA attention, labels shifted by the data loader (so the loss sees exactly seq_len tokens
per row), LoRA with PEFT's defaults (kaiming-uniform A, zero B). Peak memory is
torch.cuda.max_memory_allocated/reserved over the timed steps plus what the device has in use.
"""
import argparse
import json
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True, help="HF config.json (e.g. configs/models/llama-3.2-1b.json)")
    ap.add_argument("--method", choices=["full", "lora"], default="lora")
    ap.add_argument("--lora-rank", type=int, default=16)
    ap.add_argument("--lora-alpha", type=float, default=32)
    ap.add_argument("--lora-targets", default="q_proj,v_proj", help="comma list or all-linear")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--precision", choices=["bf16", "mixed"], default="bf16",
                    help="bf16: pure bf16 weights and AdamW states; mixed: fp32 weights under bf16 autocast")
    ap.add_argument("--checkpointing", choices=["none", "full"], default="none")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="")
    a = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(a.seed)
    with open(a.config) as f:
        cfg = json.load(f)
    config = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})
    config._attn_implementation = "sdpa"
    dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
    model = LlamaForCausalLM(config).to(device="cuda", dtype=dtype)
    model.config.use_cache = False
    if a.checkpointing == "full":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if a.method == "lora":
        from peft import LoraConfig, get_peft_model
        targets = (["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
                   if a.lora_targets == "all-linear" else a.lora_targets.split(","))
        model = get_peft_model(model, LoraConfig(r=a.lora_rank, lora_alpha=a.lora_alpha, lora_dropout=0.0,
                                                 target_modules=targets, task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, weight_decay=0.0, foreach=True)
    vocab = config.vocab_size
    gen = torch.Generator(device="cpu").manual_seed(a.seed)

    def step():
        tokens = torch.randint(0, vocab, (a.micro_batch, a.seq_len + 1), generator=gen).cuda(non_blocking=True)
        ids, labels = tokens[:, :-1], tokens[:, 1:]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "mixed"):
            logits = model(input_ids=ids).logits
        # The loss as ftexec computes it: fp32 log_softmax + nll on already-shifted labels.
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), labels.reshape(-1))
        del logits
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=False)
        return loss.item()

    losses, times = [], []
    for i in range(a.steps):
        if i == a.warmup:
            torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        losses.append(step())
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    free, total = torch.cuda.mem_get_info()
    step_time = statistics.median(times)
    tokens = a.micro_batch * a.seq_len
    out = {
        "tool": "transformers" + ("+peft" if a.method == "lora" else ""),
        "torch_version": torch.__version__,
        "device": torch.cuda.get_device_name(),
        "method": a.method, "precision": a.precision, "seq_len": a.seq_len, "micro_batch": a.micro_batch,
        "loss": losses,
        "step_time_s": step_time,
        "tokens_per_s": tokens / step_time,
        "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
        "peak_reserved_bytes": torch.cuda.max_memory_reserved(),
        "device_used_bytes": total - free,
        "trainable_params": sum(p.numel() for p in params),
    }
    text = json.dumps(out, indent=2)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
