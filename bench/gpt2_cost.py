#!/usr/bin/env python3
"""gpt2_cost.py — what one GPT-2 124M training step costs on one H200, op by op, from the shapes
alone: FLOPs, bytes moved to and from HBM, and an estimated time (the larger of FLOPs at the
tensor-core peak and bytes at the memory bandwidth: a roofline, so a lower bound per op), for
the CUDA backend as it is ("now") and as issue 15 plans it ("planned": cuDNN flash attention,
the fused classifier over a vocabulary padded to 50304, bf16 activations, GELU and its derivative
and the bias gradient in the GEMM epilogues, one AdamW launch).

    python3 bench/gpt2_cost.py [--batch 16] [--seq 1024]      (prints a markdown table)

and the totals of "built": what this build has of the plan (BUILT below).

The byte counts follow the code as issue 15 found it (now; since then the argmax left the training
step and AdamW runs in one launch): src/ops/ops_cuda.c and kernels/*.cu — fp32 activations,
every product's inputs cast to bf16 into scratch first, attention through per-head products
with the T x T probabilities in fp32, cross-entropy in three passes plus an argmax over fp32
logits. It models traffic, not caches: an op whose working set fits in the 50 MB L2 is counted
as if it went to HBM. Nothing here ran on a GPU; it is the plan's arithmetic, to be checked
against the profile gpu-check.sh takes.
"""
import argparse

PEAK_BF16 = 989e12  # dense bf16 tensor-core FLOP/s, H100/H200 SXM
HBM = 4.8e12        # H200 HBM3e bytes/s


# what each scenario has of the plan: cuDNN attention, bf16 activations (no casts of product
# inputs), the one-pass classifier without an argmax, the vocabulary padded to 50304, bias and
# GELU in the GEMM epilogues (gelu_epi: forward GELU_AUX_BIAS, which writes the pre-GELU product too,
# and backward DGELU, which reads it), the bias gradient in the dgrad GEMM's (bgrad_epi)
PLANNED = frozenset({"flash", "act16", "classifier", "pad", "gelu_epi", "bgrad_epi"})
# this build (2026-12-02): all of the plan, where cuBLASLt offers each epilogue. Its padding is
# the logits' row stride (50304), not 47 zero rows of wte: the products still have 50257 columns,
# in as many 128-wide tiles (393) as 50304 would take, so it is counted here as padded weights
# would be. Not counted: its cross-entropy reads each row twice (max and sum, then the gradient),
# the bias gradients' small add kernels (cuBLASLt's BGRADA overwrites, accumulation adds).
BUILT = frozenset({"flash", "act16", "classifier", "pad", "gelu_epi", "bgrad_epi"})


def ops(B, T, C=768, L=12, NH=12, V=50257, planned=False, has=None):
    """[(name, count per step, flops, bytes)] for forward + backward + optimizer. has: the
    features of the plan in place (PLANNED when planned, none as issue 15 found the code)."""
    has = (PLANNED if planned else frozenset()) if has is None else has
    BT, hs = B * T, C // NH
    f, h = 4, 2                        # fp32, bf16 bytes
    a = h if "act16" in has else f     # an activation element
    Vp = 50304 if "pad" in has else V  # the vocabulary in device memory
    att = B * NH * T * T               # probabilities per layer
    N = 12 * L * C * C + 13 * L * C + V * C + 1024 * C + 2 * C  # parameters (124,439,808)
    rows = []

    def add(name, flops, nbytes, count=1):
        rows.append((name, count, flops * count, nbytes * count))

    def cast(n):                       # fp32 -> bf16 copy into scratch (fp32 activations only)
        return 0 if "act16" in has else n * (f + h)

    def matmul(name, M, K, Nn, count, gelu_out=False, dgelu_in=False, bias=True):
        # forward: out = inp @ W (+ bias [, GELU] in the epilogue: gelu_out writes the pre-GELU
        # product as well)
        add(name + " fwd", 2 * M * K * Nn, cast(M * K) + M * K * h + K * Nn * h + M * Nn * a * (2 if gelu_out else 1),
            count)
        # backward: dinp = dout W^T and dW += inp^T dout; now each product casts dout and inp again;
        # dgelu_in: dinp times gelu'(pre) in the epilogue, which reads pre
        add(name + " bwd (dinp, dW)", 4 * M * K * Nn,
            2 * cast(M * Nn) + cast(M * K) + 2 * M * Nn * h + M * K * h + 2 * K * Nn * h + M * K * a + 2 * K * Nn * f +
            (M * K * a if dgelu_in else 0), count)
        if bias:  # bias gradient: a column reduction over dout (planned: the dgrad GEMM's epilogue)
            add(name + " bias grad", M * Nn, 0 if "bgrad_epi" in has else M * Nn * a, count)

    # ---- per layer ----
    ln = BT * C
    add("layernorm fwd (x2 a layer)", 8 * ln, 2 * ln * a + 2 * BT * f, 2 * L)
    add("layernorm bwd (x2 a layer)", 12 * ln, 4 * ln * a, 2 * L)
    matmul("qkv", BT, C, 3 * C, L)
    if "flash" in has:  # cuDNN SDPA reading q, k, v by strides from the qkv activation
        add("attention fwd (flash)", 4 * B * NH * T * T * hs // 2, 3 * ln * h + ln * h + BT * NH * f, L)
        add("attention bwd (flash)", 10 * B * NH * T * T * hs // 2, (3 + 2) * ln * h + 3 * ln * h + BT * NH * f, L)
    else:
        split = 3 * ln * f * 2                               # qkv_split: read 3BTC, write 3BTC
        add("attention fwd: split + q k^T", 2 * att * hs, split + 2 * cast(ln) + 2 * ln * h + att * f, L)
        add("attention fwd: causal softmax", 5 * att, 2 * att * f, L)
        add("attention fwd: P v + merge", 2 * att * hs, cast(ln) + cast(att) + ln * h + att * h + ln * f + 2 * ln * f, L)
        add("attention bwd: splits, dP, dv", 4 * att * hs,
            split + 2 * ln * f + 3 * cast(ln) + cast(att) + 3 * ln * h + att * h + 2 * att * f, L)
        add("attention bwd: softmax", 6 * att, 3 * att * f, L)
        add("attention bwd: dq, dk + merge", 4 * att * hs, 2 * cast(ln) + 2 * cast(att) + 2 * ln * h + 2 * att * h +
            2 * ln * f + split, L)
    matmul("attn proj", BT, C, C, L)
    matmul("fc", BT, C, 4 * C, L, gelu_out="gelu_epi" in has)
    if "gelu_epi" not in has:
        add("gelu fwd", 8 * BT * 4 * C, 2 * BT * 4 * C * a, L)
        add("gelu bwd", 10 * BT * 4 * C, 3 * BT * 4 * C * a, L)
    matmul("fc proj", BT, 4 * C, C, L, dgelu_in="gelu_epi" in has)
    add("residual adds (x2 a layer)", ln, 3 * ln * a, 2 * L)

    # ---- embedding, head ----
    add("encoder fwd + bwd", 2 * ln, 4 * ln * a + 2 * 1024 * C * f, 1)
    add("layernorm final fwd + bwd", 20 * ln, 6 * ln * a, 1)
    logits = BT * Vp
    add("logits fwd (lm head)", 2 * BT * C * Vp, cast(ln) + ln * h + Vp * C * h + logits * a, 1)
    if "classifier" in has:  # one pass: softmax, loss and the gradient in place
        add("classifier (fused)", 5 * logits, 2 * logits * a, 1)
    else:
        add("cross-entropy fwd (3 passes)", 5 * logits, 4 * logits * f, 1)
        add("argmax (every step)", logits, logits * f, 1)
        add("cross-entropy bwd", 2 * logits, 2 * logits * f, 1)
    add("logits bwd (dinp, dW)", 4 * BT * C * Vp,
        2 * cast(logits) + 2 * logits * h + ln * h + 2 * Vp * C * h + ln * a + 2 * Vp * C * f, 1)

    # ---- optimizer ----
    add("zero_grad", 0, N * f, 1)
    add("grad norm + clip", 3 * N, 3 * N * f, 1)
    add("AdamW" + ("" if has else " (148 launches)"), 12 * N, 7 * N * f + N * h, 1)
    return rows


def est(fl, by):
    return max(fl / PEAK_BF16, by / HBM)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    args = ap.parse_args()
    B, T = args.batch, args.seq
    now, plan = ops(B, T), ops(B, T, planned=True)
    print(f"GPT-2 124M, B={B}, T={T}, one H200: bf16 peak {PEAK_BF16 / 1e12:.0f} TFLOP/s, HBM {HBM / 1e12:.1f} TB/s\n")
    print("| op | per step | now: GFLOP | now: GB | now: est ms | planned: GFLOP | planned: GB | planned: est ms |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    pl = {r[0]: r for r in plan}
    tot = [0.0] * 6
    names = [r[0] for r in now] + [r[0] for r in plan if r[0] not in {x[0] for x in now}]
    nowd = {r[0]: r for r in now}
    for name in names:
        n, p = nowd.get(name), pl.get(name)
        cells = []
        for r, k in ((n, 0), (p, 3)):
            if r:
                t = est(r[2], r[3])
                tot[k] += r[2]
                tot[k + 1] += r[3]
                tot[k + 2] += t
                cells += [f"{r[2] / 1e9:.1f}", f"{r[3] / 1e9:.2f}", f"{t * 1e3:.2f}"]
            else:
                cells += ["-", "-", "-"]
        count = (n or p)[1]
        print(f"| {name} | {count} | " + " | ".join(cells) + " |")
    print(f"| **total** | | {tot[0] / 1e9:.0f} | {tot[1] / 1e9:.1f} | **{tot[2] * 1e3:.1f}** | {tot[3] / 1e9:.0f} | "
          f"{tot[4] / 1e9:.1f} | **{tot[5] * 1e3:.1f}** |")
    # MFU as the benchmarks count it: 6N + 6LCT FLOPs per token (the attention's share included)
    N, L, C = 124439808, 12, 768
    model_flops = (6 * N + 6 * L * C * T) * B * T
    built = ops(B, T, has=BUILT)
    tb = sum(est(r[2], r[3]) for r in built)
    for label, t in (("now", tot[2]), ("built (2026-12-02: " + ", ".join(sorted(BUILT)) + ")", tb),
                     ("planned", tot[5])):
        print(f"\n{label}: {t * 1e3:.1f} ms per step at best, {B * T / t:,.0f} tokens/s, "
              f"MFU at most {model_flops / t / PEAK_BF16 * 100:.0f}%", end="")
    gb = sum(r[3] for r in built) / 1e9
    print(f"\nbuilt: {sum(r[2] for r in built) / 1e9:.0f} GFLOP, {gb:.1f} GB moved")


if __name__ == "__main__":
    main()
