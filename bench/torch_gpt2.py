#!/usr/bin/env python3
"""torch_gpt2.py — the PyTorch reference for dtrain's GPT-2 124M step time (scripts/gpu-check.sh).

A self-contained minimal GPT-2 (the shape of GPT-2 small: V=50257, T=1024, L=12, C=768, H=12;
learned position embeddings, pre-LayerNorm blocks, GELU with the tanh approximation, causal
attention through F.scaled_dot_product_attention, LM head tied to the token embedding:
124,439,808 parameters) trained on random tokens, B=16 sequences a step, bf16 autocast, AdamW
(fused=True where this torch has it) with gradient clipping at 1.0, as dtrain's benchmark
config (configs/gpt2-124m-bench.yaml) does. Runs --warmup steps, then times --steps steps one
by one (the GPU synchronised after each) and prints one JSON line on stdout:

    {"mode": "eager", "ms_per_step": 123.4, "tokens_per_s": 132771.0, ...}

with the median step time. --mode compile wraps the model in torch.compile (its compilation
happens in the warm-up steps). Without an importable torch it prints {"skipped": "no torch"}
and exits 0; likewise {"skipped": "no CUDA device"} when --device cuda has none. Progress goes
to stderr.

    python3 bench/torch_gpt2.py --mode eager|compile [--batch 16] [--seq 1024] [--warmup 10] [--steps 30]

--task cls makes it the shipped fine-tune's classifier instead (a score head on the last position,
two labels, no LM head), for CPU comparisons: bench/contention.sh runs
`--device cpu --task cls --batch 32 --seq 64 --layers 2 --embd 64 --heads 4 --vocab 257` next to
dtrain's configs/finetune-bytes.yaml. On CPU the step runs in fp32 (no autocast), as dtrain's does.
The JSON line also has "ms_p90", the 90th percentile of the timed steps.
"""
import argparse
import inspect
import json
import math
import statistics
import sys
import time


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="GPT-2 124M training-step benchmark in PyTorch")
    ap.add_argument("--mode", choices=("eager", "compile"), default="eager")
    ap.add_argument("--batch", type=int, default=16, help="sequences per step (default 16)")
    ap.add_argument("--seq", type=int, default=1024, help="tokens per sequence, also n_positions (default 1024)")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps first (default 10)")
    ap.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke test of the script)")
    ap.add_argument("--cpu-bf16", action="store_true",
                    help="on cpu, the step under bf16 autocast (against dtrain's training.precision: bf16 there)")
    ap.add_argument("--seed", type=int, default=1337)
    ap.add_argument("--task", choices=("lm", "cls"), default="lm",
                    help="lm: next-token loss (default); cls: 2-label classification at the last position")
    return ap.parse_args(argv)


def build_model(torch, a):
    nn, F = torch.nn, torch.nn.functional

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(a.embd, 3 * a.embd)
            self.c_proj = nn.Linear(a.embd, a.embd)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(x).split(C, dim=2)
            q, k, v = (t.view(B, T, a.heads, C // a.heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(a.embd, 4 * a.embd)
            self.c_proj = nn.Linear(4 * a.embd, a.embd)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(a.embd)
            self.attn = Attention()
            self.ln_2 = nn.LayerNorm(a.embd)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(a.vocab, a.embd)
            self.wpe = nn.Embedding(a.seq, a.embd)
            self.h = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln_f = nn.LayerNorm(a.embd)
            if a.task == "cls":  # the fine-tune's head: score [2, C], no bias
                self.score = nn.Linear(a.embd, 2, bias=False)
            else:
                self.lm_head = nn.Linear(a.embd, a.vocab, bias=False)
                self.lm_head.weight = self.wte.weight  # tied
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() >= 2:
                    # GPT-2: N(0, 0.02), residual projections scaled by 1/sqrt(2L)
                    std = 0.02 / math.sqrt(2 * a.layers) if name.endswith("c_proj.weight") else 0.02
                    nn.init.normal_(p, 0.0, std)

        def forward(self, idx, targets):
            T = idx.shape[1]
            pos = torch.arange(T, device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for block in self.h:
                x = block(x)
            if a.task == "cls":  # classify at the last position (dtrain's <cls> token)
                return F.cross_entropy(self.score(self.ln_f(x)[:, -1, :]).float(), targets)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))

    return GPT()


def main(argv=None):
    a = parse_args(argv)
    try:
        import torch
    except Exception:  # ImportError, or a torch that fails to load its libraries
        print(json.dumps({"mode": a.mode, "skipped": "no torch"}))
        return 0
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"mode": a.mode, "skipped": "no CUDA device", "torch": torch.__version__}))
        return 0
    if a.embd % a.heads:
        print("torch_gpt2: --embd must be a multiple of --heads", file=sys.stderr)
        return 2

    def log(msg):
        print("torch_gpt2 [%s]: %s" % (a.mode, msg), file=sys.stderr, flush=True)

    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = build_model(torch, a).to(dev)
    n_params = sum(p.numel() for p in model.parameters())  # the tied weight counts once
    fused = cuda and "fused" in inspect.signature(torch.optim.AdamW).parameters
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, eps=1e-8,
                            **({"fused": True} if fused else {}))
    run = torch.compile(model) if a.mode == "compile" else model
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    pool = []
    for _ in range(4):  # a few batches of random tokens, reused in turn: (inputs, next-token targets)
        d = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=dev, generator=gen)
        if a.task == "cls":
            pool.append((d[:, :-1].contiguous(), d[:, -1] % 2))
        else:
            pool.append((d[:, :-1].contiguous(), d[:, 1:].contiguous()))

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step(i):
        x, y = pool[i % len(pool)]
        if cuda or a.cpu_bf16:
            with torch.autocast(device_type=dev.type, dtype=torch.bfloat16):
                loss = run(x, y)
        else:  # fp32, as dtrain's CPU backend by default
            loss = run(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    log("%d parameters, batch %d x %d, %s, AdamW fused=%s, torch %s on %s"
        % (n_params, a.batch, a.seq, a.mode, fused, torch.__version__,
           torch.cuda.get_device_name(dev) if cuda else "cpu"))
    t0 = time.perf_counter()
    for i in range(a.warmup):
        step(i)
        sync()
        if i == 0:
            log("first step done after %.1f s" % (time.perf_counter() - t0))
    log("%d warm-up steps in %.1f s" % (a.warmup, time.perf_counter() - t0))
    times, loss = [], None
    for i in range(a.steps):
        s0 = time.perf_counter()
        loss = step(a.warmup + i)
        sync()
        times.append(1e3 * (time.perf_counter() - s0))
    ms = statistics.median(times)
    out = {
        "mode": a.mode, "ms_per_step": round(ms, 3), "tokens_per_s": round(a.batch * a.seq / (ms / 1e3), 1),
        "ms_min": round(min(times), 3), "ms_max": round(max(times), 3),
        "ms_p90": round(sorted(times)[min(len(times) - 1, int(0.9 * len(times)))], 3), "steps": a.steps, "warmup": a.warmup,
        "task": a.task, "threads": torch.get_num_threads(), "cpu_bf16": a.cpu_bf16,
        "batch": a.batch, "seq": a.seq, "n_params": n_params, "loss": round(float(loss), 4) if loss is not None else None,
        "fused_adamw": fused, "torch": torch.__version__,
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
    }
    if cuda:
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
