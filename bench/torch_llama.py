#!/usr/bin/env python3
"""torch_llama.py — PyTorch eager's training step of a Llama-family model on CPU: transformers'
LlamaForCausalLM of SmolLM2-135M's shape (V 49152, L 30, C 576, 9 query / 3 key-value heads of
64, SwiGLU of 1536, tied head; random weights, as bench_cpu_step --smollm2 builds them), fp32,
B x T random tokens, the mean cross-entropy, backward, gradient clipping at 1.0 and AdamW
(foreach off: one tensor at a time, as dtrain's update goes) — the step bench/llama_vs_torch.sh
times dtrain's against. Runs --warmup steps, then --steps steps, and prints one JSON line:

    {"ms_per_step": 1234.5, "ms_best": ..., "tokens_per_s": ..., "torch": "2.15.0", "threads": 2}

with the median step. Without torch and transformers: {"skipped": "..."} and exit 0.

    python bench/torch_llama.py [--batch 4] [--seq 256] [--threads 2] [--warmup 2] [--steps 5] [--lora R] [--bf16]

--lora R: PEFT's LoRA of rank R (lora_alpha 2R, no dropout) on q, k, v, o, gate, up and down
(get_peft_model: the base frozen), AdamW and clipping over the adapters: what bench_cpu_step
--lora R times. --bf16: the forward under torch.autocast(cpu, bfloat16), what bench_cpu_step --bf16 1
is compared with.
"""
import argparse
import json
import statistics
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--batch", type=int, default=4)
ap.add_argument("--seq", type=int, default=256)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--warmup", type=int, default=2)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--lora", type=int, default=0)
ap.add_argument("--bf16", action="store_true", help="the forward under CPU bf16 autocast (dtrain: training.precision bf16)")
a = ap.parse_args()
try:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:
    print(json.dumps({"skipped": "no torch/transformers: %s" % e}))
    sys.exit(0)

torch.set_num_threads(a.threads)
torch.manual_seed(1)
cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                  num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=a.seq,
                  rms_norm_eps=1e-5, rope_theta=100000.0, tie_word_embeddings=True, attention_bias=False)
cfg._attn_implementation = "sdpa"
model = LlamaForCausalLM(cfg).float().train()
if a.lora:
    try:
        import peft
    except ImportError as e:
        print(json.dumps({"skipped": "no peft: %s" % e}))
        sys.exit(0)
    model = peft.get_peft_model(model, peft.LoraConfig(r=a.lora, lora_alpha=2 * a.lora, lora_dropout=0.0, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])).train()
params = [p for p in model.parameters() if p.requires_grad]
opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=False)
x = torch.randint(0, cfg.vocab_size, (a.batch, a.seq))
y = torch.roll(x, -1, dims=1)
times = []
for k in range(a.warmup + a.steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=False)
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16, enabled=a.bf16):
        logits = model(input_ids=x).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg.vocab_size), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    dt = time.perf_counter() - t0
    print("torch step %d: %.1f ms (loss %.4f)" % (k, dt * 1e3, loss.item()), file=sys.stderr)
    if k >= a.warmup:
        times.append(dt)
med = statistics.median(times)
print(json.dumps({"ms_per_step": round(med * 1e3, 2), "ms_best": round(min(times) * 1e3, 2),
                  "tokens_per_s": round(a.batch * a.seq / med, 1), "torch": torch.__version__, "threads": a.threads,
                  "params": sum(p.numel() for p in model.parameters()), "trainable": sum(p.numel() for p in params),
                  "peft": __import__("peft").__version__ if a.lora else None, "bf16": a.bf16}))
