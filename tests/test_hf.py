#!/usr/bin/env python3
"""test_hf.py DTRAIN SRC TMP — Hugging Face directories both ways (`dtrain export --format hf`,
`model.init_from: DIR`), checked with transformers (installed into build/venv by scripts/test.sh;
without PyTorch: it loads the config and the tokenizer) and a GPT-2 forward pass written here in
numpy over the exported tensors, as transformers' GPT2LMHeadModel and GPT2ForSequenceClassification
compute it (pooling at the last token that is not config.pad_token_id).

For four models — a byte-level classifier and language model, a BPE language model and a BPE
classifier fine-tuned from that language model's exported directory — the export must load with
AutoConfig and AutoTokenizer (architectures, shape, labels, pad token), AutoTokenizer must give
dtrain's ids, the tensors must carry the names transformers saves, and the numpy forward over
AutoTokenizer's ids must give `dtrain predict`'s probabilities (classifiers) and per-line losses
(language models) within 1e-5; so must the shipped data/pretrained. The byte classifier's
directory read back through init_from DIR is the byte tokenizer again (eval gives the run's
loss), and predict --checkpoint DIR needs no config.yaml (config.json gives it). init_from DIR takes the shape and tokenizer.json from the
directory; a key given that disagrees with config.json, a config.json of another model type,
and a directory without model.safetensors exit 2 naming both values or the file. An export
replaces an earlier one, never a directory holding other files. Exit 77 without transformers.
"""
import json
import os
import shutil
import sys

try:
    import numpy as np
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import AutoConfig, AutoTokenizer
except ImportError as e:
    print("SKIP: %s (scripts/test.sh installs transformers, tokenizers and numpy into build/venv)" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pyutil import check, dtrain, failures, start  # noqa: E402
DTRAIN, SRC, TMP = start("hf")


def train(name, config, *sets):
    run = os.path.join(TMP, name)
    dtrain("--config", config, "--quiet", "--set", "run.dir=" + run, "--set", "training.device=cpu", *sets)
    return run


def export(run, name):
    out = os.path.join(TMP, name)
    r = dtrain("export", "--checkpoint", run, "--format", "hf", "--out", out)
    check(sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"],
          "%s: export --format hf writes config.json, model.safetensors and the tokenizer files (%s)" %
          (name, r.stdout.strip()))
    return out


# ---- GPT-2 in numpy, as transformers computes it (float64) ----

def layer_norm(x, w, b):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def gelu_new(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def hidden(W, cfg, ids):
    """ln_f(x) for one sequence of ids: (T, C)"""
    g = lambda n: W["transformer." + n].astype(np.float64)
    T, C, H = len(ids), cfg.n_embd, cfg.n_head
    x = g("wte.weight")[ids] + g("wpe.weight")[:T]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(cfg.n_layer):
        p = "h.%d." % i
        h = layer_norm(x, g(p + "ln_1.weight"), g(p + "ln_1.bias"))
        qkv = h @ g(p + "attn.c_attn.weight") + g(p + "attn.c_attn.bias")
        q, k, v = (a.reshape(T, H, C // H).transpose(1, 0, 2) for a in np.split(qkv, 3, axis=-1))
        att = q @ k.transpose(0, 2, 1) / np.sqrt(C // H) + mask
        att = np.exp(att - att.max(-1, keepdims=True))
        att /= att.sum(-1, keepdims=True)
        y = (att @ v).transpose(1, 0, 2).reshape(T, C)
        x = x + y @ g(p + "attn.c_proj.weight") + g(p + "attn.c_proj.bias")
        h = layer_norm(x, g(p + "ln_2.weight"), g(p + "ln_2.bias"))
        x = x + gelu_new(h @ g(p + "mlp.c_fc.weight") + g(p + "mlp.c_fc.bias")) @ g(p + "mlp.c_proj.weight") \
            + g(p + "mlp.c_proj.bias")
    return layer_norm(x, g("ln_f.weight"), g("ln_f.bias"))


def softmax(z):
    z = np.exp(z - z.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


def hf_names(cfg, classifier):
    names = {"transformer.wte.weight", "transformer.wpe.weight", "transformer.ln_f.weight", "transformer.ln_f.bias"}
    for i in range(cfg.n_layer):
        for n in ("ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                  "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                  "mlp.c_proj.weight", "mlp.c_proj.bias"):
            names.add("transformer.h.%d.%s" % (i, n))
    return names | ({"score.weight"} if classifier else set())


def load_export(out, classifier, name):
    cfg = AutoConfig.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    W = load_file(os.path.join(out, "model.safetensors"))
    arch = "GPT2ForSequenceClassification" if classifier else "GPT2LMHeadModel"
    check(cfg.model_type == "gpt2" and cfg.architectures == [arch] and cfg.tie_word_embeddings,
          "%s: AutoConfig reads a gpt2 %s with tied embeddings" % (name, arch))
    check(set(W) == hf_names(cfg, classifier) and W["transformer.wte.weight"].shape == (cfg.vocab_size, cfg.n_embd),
          "%s: the tensors carry the names and shapes transformers saves for %s" % (name, arch))
    return cfg, tok, W


def read_jsonl(path):
    return [json.loads(l) for l in open(path, encoding="utf-8")]


def check_classifier(out, run, name, val, pad_id):
    cfg, tok, W = load_export(out, True, name)
    check(cfg.num_labels == 2 and cfg.pad_token_id == pad_id and tok.pad_token_id == pad_id,
          "%s: 2 labels, pad_token_id %d in config.json and the tokenizer" % (name, pad_id))
    lines = open(os.path.join(SRC, val), encoding="utf-8").read().splitlines()[:40]
    texts = [l.split("\t", 1)[1] for l in lines]
    pred = os.path.join(TMP, name + ".jsonl")
    dtrain("predict", "--checkpoint", run, "--input", os.path.join(SRC, val), "--out", pred)
    got = read_jsonl(pred)[:len(texts)]
    T = cfg.n_positions
    enc = tok(texts, truncation=True, max_length=T, padding="max_length")["input_ids"]
    worst = 0.0
    for ids, row in zip(enc, got):
        ids = np.array(ids)
        last = int((np.arange(len(ids)) * (ids != cfg.pad_token_id)).argmax())  # GPT2ForSequenceClassification
        logits = hidden(W, cfg, ids)[last] @ W["score.weight"].astype(np.float64).T
        worst = max(worst, float(np.abs(softmax(logits) - np.array(row["probs"])).max()))
    check(worst < 1e-5, "%s: numpy GPT2ForSequenceClassification over AutoTokenizer's ids gives dtrain predict's "
          "probabilities (max |diff| %.2g over %d lines)" % (name, worst, len(texts)))
    return cfg


def check_lm(out, weights, name, texts, eot):
    """weights: the --checkpoint of dtrain predict, or a list of its arguments"""
    cfg, tok, W = load_export(out, False, name)
    src = os.path.join(TMP, name + ".txt")
    open(src, "w", encoding="utf-8").write("\n".join(texts) + "\n")
    pred = os.path.join(TMP, name + ".jsonl")
    dtrain("predict", *(weights if isinstance(weights, list) else ["--checkpoint", weights]), "--input", src,
           "--out", pred)
    worst = 0.0
    for text, row in zip(texts, read_jsonl(pred)):
        ids = ([eot] if eot is not None else []) + tok(text)["input_ids"]
        ids = ids[:cfg.n_positions + 1]
        if len(ids) < 2:  # nothing to predict
            worst = worst if row["loss"] is None else float("inf")
            continue
        logits = hidden(W, cfg, ids[:-1]) @ W["transformer.wte.weight"].astype(np.float64).T
        lp = logits - logits.max(-1, keepdims=True)
        lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
        loss = -lp[np.arange(len(ids) - 1), ids[1:]].mean()
        worst = max(worst, abs(loss - row["loss"]) / loss)
        if row["tokens"] != len(ids) - 1:
            worst = float("inf")
    check(worst < 1e-5, "%s: numpy GPT2LMHeadModel over AutoTokenizer's ids gives dtrain predict's per-line loss "
          "(max relative diff %.2g over %d lines)" % (name, worst, len(texts)))
    return cfg, tok


FT = os.path.join(SRC, "configs/finetune-bytes.yaml")
PT = os.path.join(SRC, "configs/pretrain.yaml")
PT_BPE = os.path.join(SRC, "configs/pretrain-bpe.yaml")
VAL = "data/sentiment/val.tsv"
LM_TEXTS = ["The cat sat on the mat.", "It was the best of times, it was the worst of times.", "numbers 12 and 345",
            "x", "Ünïcödé and émoji 😀 too"]

# 1. byte classifier
run = train("cls-bytes", FT, "--set", "training.max_steps=30")
out = export(run, "cls-bytes-hf")
cfg = check_classifier(out, run, "cls-bytes-hf", VAL, 0)
tok = AutoTokenizer.from_pretrained(out)
ids = tok("not good", truncation=True)["input_ids"]
long_ids = tok("y" * 200, truncation=True)["input_ids"]
check(ids == list(b"not good") + [256] and len(long_ids) == cfg.n_positions and long_ids[-1] == 256,
      "cls-bytes-hf: AutoTokenizer gives dtrain's ids: the bytes, cut to n_positions - 1, then <cls> = 256")

# the directory back in: its tokenizer.json is the byte tokenizer, read as bytes again (<cls>
# appended, 0 padding), so evaluating it from init_from DIR gives the run's own loss; and
# predict reads a Hugging Face directory with no config.yaml from its config.json
# finetune-bytes.yaml gives the byte classifier's shape: drop those keys, so that the directory's count
ft_cfg = os.path.join(TMP, "finetune-from-dir.yaml")
text = open(FT, encoding="utf-8").read()
text = "\n".join(l for l in text.splitlines()
                 if not l.strip().startswith(("n_layer:", "n_head:", "n_embd:", "vocab_size:", "init_from:")))
open(ft_cfg, "w", encoding="utf-8").write(text.replace("train_path: data/", "train_path: %s/data/" % SRC)
                                          .replace("val_path: data/", "val_path: %s/data/" % SRC))
r = dtrain("--config", ft_cfg, "--dry-run", "--set", "model.init_from=" + out)
check('tokenizer: "bytes"' in r.stdout and "vocab_size: 257" in r.stdout,
      "init_from DIR of a byte classifier: data.tokenizer stays bytes, the shape comes from config.json")
loss = lambda r: float(r.stdout.split("val loss ")[1].split()[0])
a = dtrain("eval", "--checkpoint", run, "--config", os.path.join(run, "config.yaml"))
b = dtrain("eval", "--config", ft_cfg, "--set", "model.init_from=" + out)
check(loss(a) == loss(b), "eval of the byte classifier's directory through init_from DIR gives the run's loss (%s)"
      % loss(b))
pa, pb = os.path.join(TMP, "pa.jsonl"), os.path.join(TMP, "pb.jsonl")
dtrain("predict", "--checkpoint", run, "--input", os.path.join(SRC, VAL), "--out", pa)
r = dtrain("predict", "--checkpoint", out, "--input", os.path.join(SRC, VAL), "--out", pb)
ra, rb = read_jsonl(pa), read_jsonl(pb)
check(len(ra) == len(rb) == 2000 and all(x["label"] == y["label"] and abs(x["probs"][0] - y["probs"][0]) < 1e-6
                                          for x, y in zip(ra, rb)) and
      "config.json (no config.yaml: a Hugging Face directory)" in r.stderr,
      "predict --checkpoint DIR (no config.yaml) reads its config.json and gives the run's predictions (the batch "
      "differs: within 1e-6)")

# 2. byte language model
run = train("lm-bytes", PT, "--set", "training.max_steps=10", "--set", "model.n_layer=2", "--set", "model.n_embd=32",
            "--set", "data.seq_len=64", "--set", "model.n_head=2", "--set", "eval.every_steps=0")
out = export(run, "lm-bytes-hf")
cfg, tok = check_lm(out, run, "lm-bytes-hf", LM_TEXTS, None)
check(cfg.eos_token_id is None and tok("ab")["input_ids"] == [97, 98],
      "lm-bytes-hf: no end-of-text token, and AutoTokenizer's ids are the bytes")

# 3. BPE language model on a tokenizer trained here
tj = os.path.join(TMP, "tokenizer.json")
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train([os.path.join(SRC, "data/tinytext/corpus.txt")],
          trainers.BpeTrainer(vocab_size=400, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
bpe.add_special_tokens(["<|endoftext|>"])  # the last id, as GPT-2's 50256
bpe.save(tj)
shard = os.path.join(TMP, "corpus.bin")
dtrain("data", "tokenize", "--tokenizer", tj, os.path.join(SRC, "data/tinytext/corpus.txt"), shard)
lm = ["--set", "data.train_path=" + shard, "--set", "data.val_path=", "--set", "data.tokenizer=" + tj,
      "--set", "model.vocab_size=%d" % bpe.get_vocab_size(), "--set", "model.n_layer=2", "--set", "model.n_embd=32",
      "--set", "model.n_head=2", "--set", "data.seq_len=32", "--set", "eval.every_steps=0"]
run = train("lm-bpe", PT, "--set", "training.max_steps=20", *lm)
out_lm = export(run, "lm-bpe-hf")
eot = bpe.token_to_id("<|endoftext|>")
cfg, tok = check_lm(out_lm, run, "lm-bpe-hf", LM_TEXTS, eot)
check(cfg.eos_token_id == eot and tok.eos_token == "<|endoftext|>" and
      open(os.path.join(out_lm, "tokenizer.json"), "rb").read() == open(tj, "rb").read(),
      "lm-bpe-hf: the tokenizer.json is the one trained with, eos <|endoftext|> = %d" % eot)

# 4. a classifier fine-tuned from that directory: its shape and tokenizer.json come from it
ft = ["--set", "model.init_from=" + out_lm, "--set", "data.seq_len=32", "--set", "training.max_steps=20"]
r = dtrain("--config", ft_cfg, "--dry-run", "--set", "model.init_from=" + out_lm, "--set", "model.vocab_size=257",
           "--set", "run.dir=" + os.path.join(TMP, "x"), want=2)
check("model.vocab_size" in r.stderr and "257" in r.stderr and str(bpe.get_vocab_size()) in r.stderr and
      "config.json" in r.stderr, "init_from DIR: a model key that disagrees with config.json exits 2 naming both (%s)"
      % r.stderr.strip())
r = dtrain("--config", ft_cfg, "--dry-run", *ft, "--set", "run.dir=" + os.path.join(TMP, "cls-bpe"))
check("tokenizer: " in r.stdout and tj not in r.stdout and out_lm + "/tokenizer.json" in r.stdout and
      "n_embd: 32" in r.stdout, "init_from DIR: the dry run shows the directory's tokenizer.json and shape")
run = train("cls-bpe", ft_cfg, *ft)
out = export(run, "cls-bpe-hf")
check_classifier(out, run, "cls-bpe-hf", VAL, eot)

# 5. the shipped data/pretrained (configs/finetune.yaml starts from it) is such a directory too
shipped = os.path.join(SRC, "data/pretrained")
cfg, tok = check_lm(shipped, ["--config", PT_BPE, "--set", "model.init_from=" + shipped], "pretrained",
                    LM_TEXTS + [l for l in open(os.path.join(SRC, VAL), encoding="utf-8").read().splitlines()[:20]],
                    1024)
check(tok.eos_token_id == 1024 and open(os.path.join(shipped, "tokenizer.json"), "rb").read() ==
      open(os.path.join(SRC, "data/bpe/tokenizer.json"), "rb").read(),
      "data/pretrained: its tokenizer.json is data/bpe/tokenizer.json, <|endoftext|> = 1024")

# 6. bad directories and outputs
bad = os.path.join(TMP, "bert")
shutil.copytree(out_lm, bad)
c = json.load(open(os.path.join(bad, "config.json")))
c["model_type"] = "bert"
json.dump(c, open(os.path.join(bad, "config.json"), "w"))
r = dtrain("--config", ft_cfg, "--dry-run", "--set", "model.init_from=" + bad, want=2)
check("bert" in r.stderr and bad + "/config.json" in r.stderr,
      "init_from DIR with model_type bert exits 2 naming the file (%s)" % r.stderr.strip())
# a GPT-2's config.json that says llama lacks the Llama keys: exit 2 naming the first missing one
c["model_type"] = "llama"
json.dump(c, open(os.path.join(bad, "config.json"), "w"))
r = dtrain("--config", ft_cfg, "--dry-run", "--set", "model.init_from=" + bad, want=2)
check("num_hidden_layers" in r.stderr and bad + "/config.json" in r.stderr,
      "init_from DIR with model_type llama and GPT-2's keys exits 2 naming the missing key (%s)" % r.stderr.strip())
os.remove(os.path.join(bad, "model.safetensors"))
c["model_type"] = "gpt2"
json.dump(c, open(os.path.join(bad, "config.json"), "w"))
r = dtrain("--config", ft_cfg, "--dry-run", "--set", "model.init_from=" + bad, want=2)
check("no model.safetensors" in r.stderr, "init_from DIR without model.safetensors exits 2 (%s)" % r.stderr.strip())
again = dtrain("export", "--checkpoint", run, "--format", "hf", "--out", out + "/")  # a trailing slash, as shells complete
check(sorted(os.listdir(out))[0] == "config.json" and not [n for n in os.listdir(TMP) if ".tmp." in n or ".old." in n],
      "export over an earlier export (--out DIR/) replaces it, leaving nothing behind")
open(os.path.join(bad, "notes.txt"), "w").write("mine\n")
r = dtrain("export", "--checkpoint", run, "--format", "hf", "--out", bad, want=2)
check("holds notes.txt" in r.stderr and os.path.exists(os.path.join(bad, "tokenizer.json")),
      "export refuses a directory holding other files, touching nothing (%s)" % r.stderr.strip())
r = dtrain("export", "--checkpoint", run, "--format", "onnx", "--out", bad, want=2)
check("--format" in r.stderr, "export --format onnx exits 2 naming the option")

if failures:
    print("%d FAILED" % len(failures))
    sys.exit(1)
print("all passed")
