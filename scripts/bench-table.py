#!/usr/bin/env python3
"""bench-table.py — the benchmark tables of scripts/gpu-check.sh (GPT-2 124M; --model smollm2:
SmolLM2-135M's shape, configs/smollm2-bench.yaml).

    python3 scripts/bench-table.py [--model gpt2|smollm2] [--dtrain RUN_DIR] [--torch NAME=FILE]... [--gpu NAME]
                                   [--skip 10] [--out bench.md]

--dtrain: a dtrain run of configs/gpt2-124m-bench.yaml; its step time is the median step_ms of
the "train" records of RUN_DIR/metrics.jsonl after the first --skip steps (warm-up: CUDA
context, cuBLASLt heuristics, first-touch allocations), tokens/s = tokens per step / that time.
--torch NAME=FILE: the JSON line bench/torch_gpt2.py printed (a FILE that is missing, empty or
says "skipped" gives a row that says so). Below the table, dtrain's tokens/s over each reference's
that ran, as a ratio.

MFU = tokens/s * FLOPs per token / peak, FLOPs per token = 6*N + 6*L*C*T (llm.c's estimate:
6 FLOPs per parameter per token for forward + backward, plus causal attention's score and
value products), N = 124,439,808 (GPT-2 124M: V=50257, T=1024, L=12, C=768, embeddings
included, LM head tied; SmolLM2's shape: N = 134,515,008, L=30, C = 9 heads x 64 = 576), peak = dense bf16 tensor FLOP/s of the GPU named by --gpu:
H100/H200 SXM 989e12, H100 PCIe 756e12, A100 312e12; any other GPU: n/a (or --peak FLOPS).
Python standard library only.
"""
import argparse
import json
import os
import statistics
import sys

# --model: N parameters (embeddings included, the LM head tied), L layers, C the attention's
# width (query heads x head size), T the sequence; FLOPs per token = 6N + 6LCT
MODELS = {
    "gpt2": ("GPT-2 124M", 124_439_808, 12, 768, 1024),          # 803,261,952 FLOPs/token
    "smollm2": ("SmolLM2-135M's shape", 134_515_008, 30, 576, 1024),  # 913,258,368 FLOPs/token
}


def peak_for(gpu):
    g = (gpu or "").upper()
    if "H100" in g and "PCIE" in g:
        return 756e12
    if "H100" in g or "H200" in g:
        return 989e12
    if "A100" in g:
        return 312e12
    return None


def dtrain_row(run_dir, skip):
    path = os.path.join(run_dir, "metrics.jsonl")
    recs = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    r = json.loads(line)
                except ValueError:
                    continue
                if r.get("type") == "train" and r.get("step_ms") and r.get("tokens_per_s"):
                    recs[int(r["step"])] = r
    except OSError as e:
        return None, "no metrics (%s)" % e.strerror
    steady = [recs[s] for s in sorted(recs) if s > skip]
    if not steady:
        return None, "no train steps after step %d (%d recorded)" % (skip, len(recs))
    ms = statistics.median(r["step_ms"] for r in steady)
    r0 = steady[0]
    tokens_per_step = r0["tokens_per_s"] * r0["step_ms"] / 1e3
    note = "median of steps %d-%d" % (skip + 1, max(recs))
    if all("fwd_ms" in r for r in steady):  # logging.phase_times: the split of the step
        f, b, o = (statistics.median(r[k] for r in steady) for k in ("fwd_ms", "bwd_ms", "opt_ms"))
        note += "; forward %.1f, backward %.1f, optimizer %.1f ms" % (f, b, o)
    return (ms, tokens_per_step / (ms / 1e3)), note


def torch_row(path):
    try:
        with open(path, encoding="utf-8") as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip().startswith("{")]
    except OSError:
        return None, "did not run"
    if not lines:
        return None, "no result (failed or timed out: see its log)"
    try:
        r = json.loads(lines[-1])
    except ValueError:
        return None, "unreadable result"
    if "skipped" in r:
        return None, "skipped: %s" % r["skipped"]
    return (float(r["ms_per_step"]), float(r["tokens_per_s"])), "median of %s steps after %s warm-up" % (
        r.get("steps", "?"), r.get("warmup", "?"))


def main(argv=None):
    ap = argparse.ArgumentParser(description="GPT-2 124M benchmark table (markdown)")
    ap.add_argument("--dtrain", help="run dir of the dtrain benchmark run")
    ap.add_argument("--dtrain-name", default="dtrain (bf16)")
    ap.add_argument("--torch", action="append", default=[], metavar="NAME=FILE")
    ap.add_argument("--gpu", default="", help="GPU name (nvidia-smi --query-gpu=name)")
    ap.add_argument("--peak", type=float, help="peak dense bf16 FLOP/s (overrides the table by GPU name)")
    ap.add_argument("--skip", type=int, default=10, help="dtrain warm-up steps left out (default 10)")
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("--model", choices=sorted(MODELS), default="gpt2", help="the benchmark's model (default gpt2)")
    a = ap.parse_args(argv)
    desc, n_params, L, C, T = MODELS[a.model]
    flops_per_token = 6 * n_params + 6 * L * C * T

    peak = a.peak or peak_for(a.gpu)
    rows = []
    if a.dtrain:
        rows.append((a.dtrain_name,) + dtrain_row(a.dtrain, a.skip))
    for spec in a.torch:
        name, _, path = spec.partition("=")
        rows.append((name,) + torch_row(path))

    out = ["| impl | ms/step | tokens/s | MFU | note |", "| --- | ---: | ---: | ---: | --- |"]
    for name, val, note in rows:
        if val is None:
            out.append("| %s | - | - | - | %s |" % (name, note))
            continue
        ms, tps = val
        mfu = "%.1f%%" % (100.0 * tps * flops_per_token / peak) if peak else "n/a"
        out.append("| %s | %.1f | %.0f | %s | %s |" % (name, ms, tps, mfu, note))
    out.append("")
    # the speed against each reference that ran, as a ratio of tokens/s (the same run, the same GPU)
    base = rows[0][1] if a.dtrain else None
    ratios = ["%s / %s: %.2fx the tokens/s (the same run, the same GPU)" % (a.dtrain_name, name, base[1] / val[1])
              for name, val, _ in rows[1:] if base and val and val[1] > 0]
    out += ratios + [""] * bool(ratios)
    out.append("%s (N = %d, L=%d, C=%d, T=%d), B=16 per GPU, bf16, GPU: %s. MFU = tokens/s x "
               "(6N + 6LCT = %d FLOPs/token) / %s." % (desc, n_params, L, C, T, a.gpu or "unknown",
                                                       flops_per_token,
                                                       "%.0f TFLOP/s dense bf16" % (peak / 1e12) if peak
                                                       else "peak (unknown for this GPU: n/a)"))
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
