#!/usr/bin/env python3
"""test_llama.py DTRAIN SRC TMP — model.type llama against an independent implementation: the
numpy forward of tests/llama_ref.py (transformers' LlamaForCausalLM, float64), differentiated by
autograd for the training step.

A random Llama-family Hugging Face directory (grouped-query attention: 4 query heads on 2
key/value heads, a head size that is not hidden_size / num_attention_heads, an untied head,
rope_theta 500000, rms_norm_eps 1e-5; its ids are bytes) is read through model.init_from and
--checkpoint DIR:
- `dtrain predict` gives each line's mean loss as the reference does, within 1e-4 relative;
- three AdamW steps (weight decay on the matrices, gradient clipping) on a token shard give the
  reference's weights, on 1, 2 and 4 workers (and 2 x 2 micro-batches), within 2e-5 absolute;
- `dtrain export --format hf` writes a config.json that transformers' AutoConfig reads as the
  same LlamaConfig and the tensors under transformers' names; the export predicts as the run;
- the variants dtrain does not build are refused with exit 2 naming config.json and the key
  (rope_scaling, sliding_window, hidden_act, mlp_bias); a config key of another model.type
  is refused; a classifier fine-tuned from the directory trains and predicts.
Exit 77 without numpy, autograd, safetensors or transformers (scripts/test.sh installs them).
"""
import json
import os
import shutil
import sys

try:
    import numpy as np
    import autograd
    import autograd.numpy as anp
    from safetensors.numpy import load_file, save_file
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoConfig
except ImportError as e:
    print("SKIP: %s (scripts/test.sh installs numpy, autograd and transformers into build/venv)" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pyutil import check, dtrain, failures, start  # noqa: E402
DTRAIN, SRC, TMP = start("llama")
import llama_ref as ref  # noqa: E402


CFG = ref.CFG
random_weights = ref.random_weights
write_dir = ref.write_dir


def as64(W):
    return {k: v.astype(np.float64) for k, v in W.items()}


W0 = random_weights(CFG, 7)
HF = os.path.join(TMP, "hf")
write_dir(HF, CFG, W0)

# ---- 1. the forward: predict's per-line losses ----
lines = ["The quick brown fox jumps over the lazy dog.", "Llamas rotate their queries; GPT-2 learns positions!",
         "a", "0123456789 " * 4, "\u00dcnic\u00f6de \u2014 r\u00e9sum\u00e9 \U0001F600"]
text = os.path.join(TMP, "lines.txt")
with open(text, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")


def predict_worst(hf, cfg, W, name):
    """dtrain predict over the lines with directory hf: its losses, and the worst relative
    difference from the reference's with cfg and W"""
    out = os.path.join(TMP, "pred-%s.jsonl" % name)
    dtrain("predict", "--checkpoint", hf, "--input", text, "--out", out, "--progress", "never")
    got = [json.loads(l) for l in open(out)]
    check(len(got) == len(lines), "predict %s: a line of output for each line" % name)
    worst = 0.0
    for line, g in zip(lines, got):
        ids = np.array([list(line.encode("utf-8"))])
        if ids.shape[1] < 2:
            check(g["loss"] is None, "predict %s: a one-token line has no loss" % name)
            continue
        want = float(ref.mean_lm_loss(as64(W), cfg, ids[:, :-1], ids[:, 1:]))
        worst = max(worst, abs(g["loss"] - want) / abs(want))
    return [g["loss"] for g in got], worst


base_losses, worst = predict_worst(HF, CFG, W0, "llama")
check(worst <= 1e-4, "predict: each line's loss is the reference's (GQA 4 on 2, head_dim 8 != 24/4, untied head) "
      "within 1e-4 relative (worst %.2e)" % worst)

# Llama 3.1's rope scaling: with head size 8 and rope_theta 500000 the wavelengths are 6, 167,
# 4443 and 118000 positions; original 256 and factors 1 and 4 keep the first, interpolate the
# second and divide the others by 8
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256}
CFG3 = dict(CFG, rope_scaling=LLAMA3)
f0, f3 = ref.inv_freq(CFG), ref.inv_freq(CFG3)
check(f3[0] == f0[0] and f0[1] / 8 < f3[1] < f0[1] and f3[2] == np.float32(f0[2] / np.float32(8)),
      "the reference's llama3 frequencies: kept, interpolated, divided (%s -> %s)" % (f0, f3))
HF3 = os.path.join(TMP, "hf-llama3")
write_dir(HF3, CFG3, W0)
losses3, worst = predict_worst(HF3, CFG3, W0, "llama3")
check(worst <= 1e-4 and max(abs(a - b) for a, b in zip(losses3, base_losses) if a is not None) > 1e-3,
      "rope_scaling llama3: each line's loss is the reference's within 1e-4 relative (worst %.2e), and not the "
      "unscaled one's" % worst)
cls3_yaml = os.path.join(TMP, "cls-llama3.yaml")
with open(cls3_yaml, "w") as f:
    f.write("data:\n  train_path: %s/data/sentiment/train.tsv\n  seq_len: 32\nmodel:\n  num_labels: 2\n"
            "  init_from: %s\n" % (SRC, HF3))
r = dtrain("--config", cls3_yaml, "--dry-run")
check("  rope_scaling:\n    factor: 8\n    low_freq_factor: 1\n    high_freq_factor: 4\n"
      "    original_max_position_embeddings: 256\n" in r.stdout,
      "--dry-run shows the scaling taken from config.json")
for key, value, says in [("factor", None, "rope_scaling.factor: expected a number >= 1"),
                         ("high_freq_factor", 0.5, "rope_scaling.high_freq_factor: expected a number > 1")]:
    bad = os.path.join(TMP, "bad-llama3-" + key)
    rs = dict(LLAMA3, **{key: value})
    if value is None:
        del rs[key]
    write_dir(bad, dict(CFG, rope_scaling=rs), W0)
    r = dtrain("predict", "--checkpoint", bad, "--input", text, "--out", os.path.join(TMP, "x.jsonl"), want=2)
    check(bad + "/config.json: " + says in r.stderr, "rope_scaling llama3 with %s %s: exit 2 naming it (%s)"
          % (key, value, r.stderr.strip()[-200:]))

# Qwen 2: q, k and v with biases, o without; model_type qwen2 says so
CFGQ = dict(CFG, model_type="qwen2", architectures=["Qwen2ForCausalLM"], use_sliding_window=False,
            sliding_window=4096, max_window_layers=2)
WQ = dict(W0)
rngq = np.random.default_rng(11)
for l in range(CFG["num_hidden_layers"]):
    for proj, n in [("q", 4 * 8), ("k", 2 * 8), ("v", 2 * 8)]:
        WQ["model.layers.%d.self_attn.%s_proj.bias" % (l, proj)] = (rngq.standard_normal(n) * 0.3).astype(np.float32)
HFQ = os.path.join(TMP, "hf-qwen2")
write_dir(HFQ, CFGQ, WQ)
_, worst = predict_worst(HFQ, CFGQ, WQ, "qwen2")
check(worst <= 1e-4, "model_type qwen2 (q, k, v biases, o without): each line's loss is the reference's within 1e-4 "
      "relative (worst %.2e)" % worst)

# ---- 2. three AdamW steps on 1, 2 and 4 workers against the reference's ----
T, B_GLOBAL, STEPS = 16, 4, 3
LR, BETAS, EPS, WD, CLIP = 3e-3, (0.9, 0.95), 1e-6, 0.1, 0.5
rng = np.random.default_rng(3)
tokens = rng.integers(0, 257, size=B_GLOBAL * STEPS * T + 1, dtype=np.int64)
shard = os.path.join(TMP, "train.bin")
ref.write_shard(shard, tokens)


def reference_steps():
    """AdamW as torch.optim.AdamW over the mean loss of each global batch (sample i = tokens
    [i*T, i*T+T+1)), decay on >= 2-D tensors, the gradient clipped to CLIP by its global norm"""
    names = sorted(W0)

    def loss(flat, ids, tgt):
        return ref.mean_lm_loss(dict(zip(names, flat)), CFG, ids, tgt)

    rows = [np.stack([tokens[(s * B_GLOBAL + i) * T:(s * B_GLOBAL + i) * T + T + 1] for i in range(B_GLOBAL)])
            for s in range(STEPS)]
    return ref.adamw_steps(W0, autograd.grad(loss), [(r[:, :-1], r[:, 1:]) for r in rows], LR, BETAS, EPS, WD, CLIP)


want = reference_steps()
base = ["--set", "data.train_path=" + shard, "--set", "data.format=tokens", "--set", "data.seq_len=%d" % T,
        "--set", "data.shuffle=false", "--set", "model.init_from=" + HF, "--set", "training.max_steps=%d" % STEPS,
        "--set", "optimizer.lr=%g" % LR, "--set", "optimizer.betas=[%g,%g]" % BETAS, "--set", "optimizer.eps=%g" % EPS,
        "--set", "optimizer.weight_decay=%g" % WD, "--set", "optimizer.grad_clip=%g" % CLIP,
        "--set", "optimizer.schedule=constant", "--set", "training.device=cpu", "--set", "eval.every_steps=0",
        "--set", "checkpoint.every_steps=0", "--set", "fault_tolerance.max_restarts=0", "--quiet", "--progress", "never"]
cfg_yaml = os.path.join(TMP, "llama.yaml")
with open(cfg_yaml, "w") as f:
    f.write("data:\n  train_path: x\n")
for workers, accum in [(1, 1), (2, 1), (4, 1), (2, 2)]:
    run = os.path.join(TMP, "train-%dx%d" % (workers, accum))
    dtrain("--config", cfg_yaml, "--set", "run.dir=" + run, "--set", "training.num_workers=%d" % workers,
           "--set", "training.grad_accum_steps=%d" % accum,
           "--set", "data.batch_size_per_worker=%d" % (B_GLOBAL // workers // accum), *base)
    W = load_file(os.path.join(run, "model.safetensors"))
    err = max(float(np.max(np.abs(W[k] - want[k]))) for k in want)
    moved = max(float(np.max(np.abs(want[k] - W0[k]))) for k in want)
    check(sorted(W) == sorted(want) and err <= 2e-5,
          "%d worker(s) x %d micro-batch(es): 3 AdamW steps give the reference's weights within 2e-5 (worst %.2e; "
          "the steps moved them by up to %.2e)" % (workers, accum, err, moved))
    if workers == 1:
        run1 = run

# ---- 3. export --format hf ----
exp = os.path.join(TMP, "export")
dtrain("export", "--checkpoint", run1, "--format", "hf", "--out", exp)
c = AutoConfig.from_pretrained(exp)
theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", getattr(c, "rope_theta", None))
check(c.model_type == "llama" and c.architectures == ["LlamaForCausalLM"] and c.num_key_value_heads == 2 and
      c.head_dim == 8 and c.hidden_size == 24 and c.intermediate_size == 40 and theta == 500000.0 and
      not c.tie_word_embeddings and abs(c.rms_norm_eps - 1e-5) < 1e-12 and c.hidden_act == "silu",
      "export: AutoConfig reads the LlamaConfig back (kv heads %s, head_dim %s, rope_theta %s)" %
      (c.num_key_value_heads, c.head_dim, theta))
# transformers 5 saves rope_theta inside rope_parameters: the directory it writes reads the same
v5 = os.path.join(TMP, "export-v5")
shutil.copytree(exp, v5)
c.save_pretrained(v5)
check("rope_parameters" in json.load(open(os.path.join(v5, "config.json"))),
      "transformers' save_pretrained writes rope_parameters")

for name, hf, cfg, W in [("llama3", HF3, CFG3, W0), ("qwen2", HFQ, CFGQ, WQ)]:
    ex = os.path.join(TMP, "export-" + name)
    dtrain("export", "--checkpoint", hf, "--format", "hf", "--out", ex)
    cx = AutoConfig.from_pretrained(ex)
    rp = getattr(cx, "rope_parameters", None) or getattr(cx, "rope_scaling", None) or {}
    if name == "llama3":
        ok = cx.model_type == "llama" and rp.get("rope_type") == "llama3" and all(rp.get(k) == v for k, v in LLAMA3.items())
    else:
        ok = cx.model_type == "qwen2" and cx.architectures == ["Qwen2ForCausalLM"] and not cx.use_sliding_window
    Ex = load_file(os.path.join(ex, "model.safetensors"))
    check(ok and sorted(Ex) == sorted(W) and all(np.array_equal(Ex[k], W[k]) for k in W),
          "export of the %s directory: AutoConfig reads it back (%s, %s), the same tensors" % (name, cx.model_type, rp))
    _, worst = predict_worst(ex, cfg, W, name + "-export")
    check(worst <= 1e-4, "the %s export predicts as the reference (worst %.2e)" % (name, worst))

# a value of more than 10 significant digits is written as it is (export wrote 10)
odd = os.path.join(TMP, "hf-theta")
write_dir(odd, dict(CFG, rope_theta=123456.78901234567), W0)
dtrain("export", "--checkpoint", odd, "--format", "hf", "--out", odd + "-export")
theta_back = json.load(open(os.path.join(odd + "-export", "config.json")))["rope_theta"]
check(theta_back == 123456.78901234567, "export writes rope_theta 123456.78901234567 exactly (%r)" % theta_back)

E = load_file(os.path.join(exp, "model.safetensors"))
check(sorted(E) == sorted(W0), "export: the tensors carry transformers' LlamaForCausalLM names")
out2 = os.path.join(TMP, "pred-export.jsonl")
dtrain("predict", "--checkpoint", exp, "--input", text, "--out", out2, "--progress", "never")
Wexp = as64(E)
worst = 0.0
for line, g in zip(lines, [json.loads(l) for l in open(out2)]):
    ids = list(line.encode("utf-8"))
    if len(ids) < 2:
        continue
    # the export's tokenizer_config.json says model_max_length T (the run's data.seq_len): predict
    # scores a line in windows of T tokens, positions from 0 in each
    total = n = 0
    for k in range(0, len(ids) - 1, T):
        x, y = np.array([ids[k:k + T]]), np.array([ids[k + 1:k + T + 1]])
        x = x[:, :y.shape[1]]
        total += float(np.sum(ref.lm_losses(Wexp, CFG, x, y)))
        n += y.shape[1]
    want_l = total / n
    worst = max(worst, abs(g["loss"] - want_l) / abs(want_l))
check(worst <= 1e-4, "export: predict over the exported directory is the reference's over its tensors (worst %.2e)"
      % worst)
out3 = os.path.join(TMP, "pred-v5.jsonl")
dtrain("predict", "--checkpoint", v5, "--input", text, "--out", out3, "--progress", "never")
check(open(out3).read() == open(out2).read(), "the directory as transformers 5 saves it (rope_parameters) predicts the same")

# ---- 4. refusals ----
for key, value, says in [("rope_scaling", {"rope_type": "linear", "factor": 2.0}, "rope_scaling"),
                         ("sliding_window", 16, "sliding_window"), ("hidden_act", "gelu", "hidden_act"),
                         ("mlp_bias", True, "mlp_bias")]:
    bad = os.path.join(TMP, "bad-" + key)
    write_dir(bad, dict(CFG, **{key: value}), W0)
    r = dtrain("predict", "--checkpoint", bad, "--input", text, "--out", os.path.join(TMP, "x.jsonl"), want=2)
    check(bad + "/config.json" in r.stderr and says in r.stderr,
          "config.json with %s %s: exit 2 naming the file and the key (%s)" % (key, value, r.stderr.strip()[-160:]))
# key/value heads that do not divide the query heads: config.json's key named, on every path
bad = os.path.join(TMP, "bad-kv")
write_dir(bad, dict(CFG, num_key_value_heads=3), W0)
bad_yaml = os.path.join(TMP, "bad-kv.yaml")
with open(bad_yaml, "w") as f:
    f.write("data:\n  train_path: %s/data/sentiment/train.tsv\n  seq_len: 32\nmodel:\n  num_labels: 2\n"
            "  init_from: %s\n" % (SRC, bad))
for args in (["predict", "--checkpoint", bad, "--input", text, "--out", os.path.join(TMP, "x.jsonl")],
             ["--config", bad_yaml, "--dry-run"]):
    r = dtrain(*args, want=2)
    check(bad + "/config.json: num_key_value_heads: 3 does not divide num_attention_heads: 4" in r.stderr,
          "config.json with 3 key/value heads for 4 query heads, %s: exit 2 naming the file and its keys (%s)"
          % (args[0], r.stderr.strip()[-200:]))
r = dtrain("--config", cfg_yaml, "--dry-run", "--set", "model.rope_theta=10", want=2)
check("model.rope_theta" in r.stderr and "applies to model.type llama" in r.stderr,
      "model.rope_theta with model.type gpt2: exit 2 (%s)" % r.stderr.strip())
r = dtrain("--config", cfg_yaml, "--dry-run", "--set", "model.type=llama", "--set", "model.n_head=4",
           "--set", "model.num_key_value_heads=3", "--set", "model.intermediate_size=8", want=2)
check("model.num_key_value_heads" in r.stderr and "divisor" in r.stderr,
      "3 key/value heads for 4 query heads: exit 2 (%s)" % r.stderr.strip())

# ---- 5. a classifier from the directory ----
run = os.path.join(TMP, "cls")
cls_yaml = os.path.join(TMP, "cls.yaml")
with open(cls_yaml, "w") as f:  # the shape and model.type from the directory's config.json
    f.write("data:\n  train_path: %s/data/sentiment/train.tsv\n  val_path: %s/data/sentiment/val.tsv\n"
            "  seq_len: 64\nmodel:\n  num_labels: 2\n  init_from: %s\n" % (SRC, SRC, HF))
dtrain("--config", cls_yaml, "--set", "run.dir=" + run, "--set", "training.max_steps=30", "--set", "eval.max_batches=2",
       "--set", "training.device=cpu", "--quiet", "--progress", "never")
W = load_file(os.path.join(run, "model.safetensors"))
check("score.weight" in W and "lm_head.weight" not in W and W["score.weight"].shape == (2, 24),
      "a classifier from the language model's directory: score (2, 24) beside the layers, no lm_head")
outc = os.path.join(TMP, "pred-cls.jsonl")
dtrain("predict", "--checkpoint", run, "--input", os.path.join(SRC, "data/sentiment/val.tsv"), "--out", outc,
       "--progress", "never")
check(sum(1 for _ in open(outc)) == sum(1 for _ in open(os.path.join(SRC, "data/sentiment/val.tsv"))),
      "the classifier predicts every line")

if failures:
    print("test_llama: %d check(s) failed" % len(failures))
    sys.exit(1)
print("test_llama: ok")
