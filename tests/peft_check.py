#!/usr/bin/env python3
"""peft_check.py DTRAIN SRC TMP — dtrain's LoRA against PEFT itself (torch, transformers and peft;
exit 77 without them: CI does not install PyTorch, tests/test_lora_peft.py holds the same
adapters to a numpy reference there).

1. The shipped fine-tune (GPT-2 classifier, data/pretrained) trained with model.lora on all four
   of GPT-2's projections, exported with `dtrain export --format peft`, loaded by
   peft.PeftModel.from_pretrained over transformers' GPT2ForSequenceClassification of
   data/pretrained: its class probabilities on the validation texts equal `dtrain predict`'s.
2. A random Llama (grouped-query attention, an untied head) trained with model.lora on all seven
   projections: PeftModel's logits give each line's mean loss as `dtrain predict` does.
3. The same with model.lora.base_dtype bf16, against PeftModel over that Llama with its matrices
   rounded to bf16 (the norms as they are).
Each within 1e-5 relative (the worst printed)."""
import json
import os
import sys

try:
    import numpy as np
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
except ImportError as e:
    print("SKIP: %s (torch, transformers and peft are not part of the test setup)" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pyutil import check, dtrain, failures, start  # noqa: E402
DTRAIN, SRC, TMP = start("peft-check")
torch.set_default_dtype(torch.float64)


# ---- 1. GPT-2 classifier ----
run = os.path.join(TMP, "gpt2")
dtrain("--config", "configs/finetune.yaml", "--set", "run.dir=" + run, "--set", "training.max_steps=60",
       "--set", "model.lora.rank=8", "--set", "model.lora.alpha=16", "--set", "optimizer.lr=2e-3",
       "--set", "model.lora.targets=[c_attn, attn.c_proj, c_fc, mlp.c_proj]", "--set", "eval.every_steps=0", "--quiet")
exp = os.path.join(TMP, "gpt2-peft")
dtrain("export", "--checkpoint", run, "--format", "peft", "--out", exp)
lines = [l.rstrip("\n").split("\t", 1) for l in open(os.path.join(SRC, "data/sentiment/val.tsv"), encoding="utf-8")][:64]
inp = os.path.join(TMP, "val.txt")
with open(inp, "w", encoding="utf-8") as f:
    f.write("\n".join(t for _, t in lines) + "\n")
out = os.path.join(TMP, "pred.jsonl")
dtrain("predict", "--checkpoint", run, "--input", inp, "--out", out)
got = [json.loads(l)["probs"] for l in open(out)]
tok = AutoTokenizer.from_pretrained(os.path.join(SRC, "data/pretrained"))
base = AutoModelForSequenceClassification.from_pretrained(os.path.join(SRC, "data/pretrained"), num_labels=2,
                                                          pad_token_id=1024, torch_dtype=torch.float64)
model = PeftModel.from_pretrained(base, exp).eval()
worst = 0.0
with torch.no_grad():
    for (_, text), g in zip(lines, got):
        ids = torch.tensor([tok(text)["input_ids"]])
        p = torch.softmax(model(input_ids=ids).logits[0], -1).numpy()
        worst = max(worst, float(np.max(np.abs(p - np.array(g)) / np.maximum(np.abs(p), 1e-30))))
check(worst <= 1e-5, "GPT-2 classifier: PeftModel over GPT2ForSequenceClassification gives dtrain predict's class "
      "probabilities on %d validation texts within 1e-5 relative (worst %.2e)" % (len(lines), worst))

# ---- 2. Llama language model ----
sys.path.insert(0, os.path.join(SRC, "tests"))
import llama_ref as ref  # noqa: E402

hf = os.path.join(TMP, "llama")
ref.write_dir(hf, ref.CFG, ref.random_weights(ref.CFG, 5))
text = ["The quick brown fox jumps over the lazy dog.", "Adapters: a low-rank update on a frozen model.",
        "0123456789 " * 4]
tx = os.path.join(TMP, "lines.txt")
with open(tx, "w") as f:
    f.write("\n".join(text) + "\n")
shard = os.path.join(TMP, "train.bin")  # the lines' bytes as a token shard, 8 times over
ref.write_shard(shard, np.frombuffer(("\n".join(text) + "\n").encode() * 8, dtype=np.uint8))
cfg = os.path.join(TMP, "llama.yaml")
with open(cfg, "w") as f:
    f.write("data:\n  train_path: %s\n  seq_len: 32\n  batch_size_per_worker: 2\nmodel:\n  init_from: %s\n" % (shard, hf))
run = os.path.join(TMP, "llama-run")
dtrain("--config", cfg, "--set", "run.dir=" + run, "--set", "training.max_steps=20", "--set", "optimizer.lr=1e-2",
       "--set", "optimizer.warmup_steps=0", "--set", "model.lora.rank=4", "--set", "model.lora.alpha=8",
       "--set", "model.lora.targets=[q, k, v, o, gate, up, down]", "--set", "eval.every_steps=0", "--quiet")
exp = os.path.join(TMP, "llama-peft")
dtrain("export", "--checkpoint", run, "--format", "peft", "--out", exp)
out = os.path.join(TMP, "llama-pred.jsonl")
dtrain("predict", "--checkpoint", run, "--input", tx, "--out", out, "--set", "data.seq_len=64")
got = [json.loads(l)["loss"] for l in open(out)]
model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float64), exp).eval()
base = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float64).eval()
worst, moved = 0.0, 0.0
with torch.no_grad():
    for t, g in zip(text, got):
        ids = torch.tensor([list(t.encode())])
        want = float(torch.nn.functional.cross_entropy(model(input_ids=ids[:, :-1]).logits[0], ids[0, 1:]))
        plain = float(torch.nn.functional.cross_entropy(base(input_ids=ids[:, :-1]).logits[0], ids[0, 1:]))
        worst = max(worst, abs(g - want) / abs(want))
        moved = max(moved, abs(want - plain))
check(worst <= 1e-5 and moved > 1e-3, "Llama (GQA), 7 projections: PeftModel's logits give dtrain predict's per-line "
      "losses within 1e-5 relative (worst %.2e; the adapters moved them by up to %.3f)" % (worst, moved))

# ---- 3. the same with the frozen base kept in bf16 (model.lora.base_dtype): PEFT over the base
# whose matrices are rounded to bf16 (the norms stay as they are) ----
run16 = os.path.join(TMP, "llama-run16")
dtrain("--config", cfg, "--set", "run.dir=" + run16, "--set", "training.max_steps=20", "--set", "optimizer.lr=1e-2",
       "--set", "optimizer.warmup_steps=0", "--set", "model.lora.rank=4", "--set", "model.lora.alpha=8",
       "--set", "model.lora.targets=[q, k, v, o, gate, up, down]", "--set", "model.lora.base_dtype=bf16",
       "--set", "eval.every_steps=0", "--quiet")
exp16 = os.path.join(TMP, "llama-peft16")
dtrain("export", "--checkpoint", run16, "--format", "peft", "--out", exp16)
out16 = os.path.join(TMP, "llama-pred16.jsonl")
dtrain("predict", "--checkpoint", run16, "--input", tx, "--out", out16, "--set", "data.seq_len=64")
got16 = [json.loads(l)["loss"] for l in open(out16)]
base16 = AutoModelForCausalLM.from_pretrained(hf, torch_dtype=torch.float64).eval()
with torch.no_grad():
    for prm in base16.parameters():
        if prm.dim() == 2:
            prm.copy_(prm.to(torch.bfloat16).to(torch.float64))
model16 = PeftModel.from_pretrained(base16, exp16).eval()
worst16, off = 0.0, 0.0
with torch.no_grad():
    for t, g, g32 in zip(text, got16, got):
        ids = torch.tensor([list(t.encode())])
        want = float(torch.nn.functional.cross_entropy(model16(input_ids=ids[:, :-1]).logits[0], ids[0, 1:]))
        worst16 = max(worst16, abs(g - want) / abs(want))
        off = max(off, abs(g - g32))
check(worst16 <= 1e-5 and off > 0, "Llama, the base in bf16: PeftModel over the base with its matrices rounded to "
      "bf16 gives dtrain predict's per-line losses within 1e-5 relative (worst %.2e; %.2e from the fp32 base's run)"
      % (worst16, off))
if failures:
    sys.exit(1)
print("peft_check: ok")
