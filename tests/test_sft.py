#!/usr/bin/env python3
"""test_sft.py DTRAIN SRC TMP — chat and prompt/completion data (src/io/sft.c) against
transformers and TRL's conventions.

A byte-level BPE with ChatML's special tokens is trained here with `tokenizers`, beside a
tokenizer_config.json holding SmolLM2's chat template. `dtrain data show --json` prints each row's
ids and targets (-1: not counted), which must be:
- chat: transformers' apply_chat_template(messages, tokenize=True) ids, and as the counted
  targets exactly the tokens of its assistant mask (return_assistant_tokens_mask, with the same
  template written with {% generation %} blocks, as TRL's assistant-only loss takes them): the
  answer and its <|im_end|>, never the prompt, the system message or the "assistant" header;
  data.train_on: all counts every target;
- completion: tokenizer(prompt + completion + eos) with the targets after the prompt's own
  length counted (TRL's completion mask);
- rows cut to data.seq_len + 1 tokens and padded with the end-of-text id (targets -1);
- malformed lines exit 2 naming file:line and what was expected.
Exit 77 without tokenizers, transformers or jinja2 (scripts/test.sh installs them).
"""
import re
import json
import os
import shutil
import sys

try:
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers, AddedToken
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import PreTrainedTokenizerFast
    import jinja2  # noqa: F401  (apply_chat_template renders with it)
except ImportError as e:
    print("SKIP: %s (scripts/test.sh installs tokenizers, transformers and jinja2 into build/venv)" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pyutil import check, dtrain, failures, start  # noqa: E402
DTRAIN, SRC, TMP = start("sft")


SYS = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
TURN = "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
GEN = "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
HEAD = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
        "{{ '<|im_start|>system\n" + SYS + "<|im_end|>\n' }}{% endif %}")
SMOLLM2 = HEAD + TURN + "{% endfor %}" + GEN  # SmolLM2-135M-Instruct's template, byte for byte
# the same text, the assistant's answer marked for transformers' assistant mask
MARKED = (HEAD + "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}{% generation %}"
          "{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}{% else %}" + TURN +
          "{% endif %}{% endfor %}" + GEN)

# ---- a ChatML tokenizer ----
tok_dir = os.path.join(TMP, "tok")
os.makedirs(tok_dir)
corpus = open(os.path.join(SRC, "data/tinytext/corpus.txt"), encoding="utf-8").read()[:200000].splitlines()
bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
bpe.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                                    initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
bpe.save(os.path.join(tok_dir, "tokenizer.json"))
with open(os.path.join(tok_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>",
               "bos_token": "<|im_start|>", "pad_token": "<|im_end|>", "chat_template": SMOLLM2}, f)
hf = PreTrainedTokenizerFast.from_pretrained(tok_dir)
V = len(hf)
EOT = hf.convert_tokens_to_ids("<|endoftext|>")

convs = [
    [{"role": "user", "content": "What is the capital of France?"},
     {"role": "assistant", "content": "Paris."}],
    [{"role": "system", "content": "Answer in one word."},
     {"role": "user", "content": "Colour of the sky?"},
     {"role": "assistant", "content": "\n\nBlue"},  # a newline run that BPE joins to the header's
     {"role": "user", "content": "And grass?"},
     {"role": "assistant", "content": " green, mostly \u00e9t\u00e9 \U0001F600"}],
    [{"role": "user", "content": "Say <|im_end|> please"},
     {"role": "assistant", "content": "<|im_end|>"}],
]
T = 96
chat = os.path.join(TMP, "chat.jsonl")
with open(chat, "w", encoding="utf-8") as f:
    for c in convs:
        f.write(json.dumps({"messages": c}, ensure_ascii=False) + "\n")
cfg = os.path.join(TMP, "sft.yaml")
with open(cfg, "w") as f:
    f.write("data:\n  train_path: %s\n  format: chat\n  tokenizer: %s/tokenizer.json\n  seq_len: %d\n"
            "model:\n  vocab_size: %d\n  n_layer: 1\n  n_head: 2\n  n_embd: 32\n" % (chat, tok_dir, T, V))


def rows(*extra):
    r = dtrain("data", "show", "--config", cfg, "--json", "--limit", "100", *extra)
    return [json.loads(line) for line in r.stdout.splitlines()]


def want_row(ids, counted):
    """ids cut to T + 1, the row's inputs padded with the end-of-text id and its targets"""
    ids, counted = ids[:T + 1], counted[:T + 1]
    inputs = ids[:T] + [EOT] * (T - len(ids[:T]))
    targets = [ids[t + 1] if t + 1 < len(ids) and counted[t + 1] else -1 for t in range(T)]
    return inputs, targets


# ---- chat: transformers' ids and assistant mask ----
got = rows()
check(len(got) == len(convs), "data show: a row for each conversation (%d)" % len(got))
for i, c in enumerate(convs):
    ids = hf.apply_chat_template(c, tokenize=True, return_dict=True)["input_ids"]
    marked = hf.apply_chat_template(c, chat_template=MARKED, tokenize=True, return_dict=True,
                                    return_assistant_tokens_mask=True)
    check(marked["input_ids"] == ids, "conversation %d: the marked template renders the same tokens" % i)
    inputs, targets = want_row(ids, marked["assistant_masks"])
    g = got[i] if i < len(got) else {"ids": [], "targets": []}
    check(g["ids"] == inputs, "conversation %d: dtrain's ids are apply_chat_template's (%d tokens)" % (i, len(ids)))
    check(g["targets"] == targets, "conversation %d: the counted targets are transformers' assistant mask (%d of them)"
          % (i, sum(t >= 0 for t in targets)))
    if i == 0:
        counted = hf.decode([t for t in g["targets"] if t >= 0])
        check(counted == "Paris.<|im_end|>", "conversation 0: the answer and <|im_end|> count, nothing else (%r)" % counted)
got_all = rows("--set", "data.train_on=all")
inputs, _ = want_row(hf.apply_chat_template(convs[0], tokenize=True, return_dict=True)["input_ids"], [1] * T)
n0 = len(hf.apply_chat_template(convs[0], tokenize=True, return_dict=True)["input_ids"])
check(got_all[0]["targets"][:n0 - 1] == inputs[1:n0] and got_all[0]["targets"][n0 - 1:] == [-1] * (T - n0 + 1),
      "data.train_on: all: every next token counts, the padding does not")
text = dtrain("data", "show", "--config", cfg, "--limit", "1").stdout
check("\u00abParis.<|im_end|>\u00bb" in text and text.startswith("example 0: "),
      "data show marks the counted run: %r" % text[-120:])

# ---- cut to seq_len + 1 ----
long_conv = [{"role": "user", "content": "Tell me a story."}, {"role": "assistant", "content": "Once upon a time " * 40}]
with open(chat, "w", encoding="utf-8") as f:
    f.write(json.dumps({"messages": long_conv}) + "\n")
ids = hf.apply_chat_template(long_conv, tokenize=True, return_dict=True)
marked = hf.apply_chat_template(long_conv, chat_template=MARKED, tokenize=True, return_dict=True,
                                return_assistant_tokens_mask=True)
inputs, targets = want_row(ids["input_ids"], marked["assistant_masks"])
g = rows()[0]
check(len(ids["input_ids"]) > T + 1 and g["ids"] == inputs and g["targets"] == targets,
      "a conversation of %d tokens: its first %d, the targets within them" % (len(ids["input_ids"]), T + 1))
r = dtrain("--config", cfg, "--dry-run", "--set", "run.dir=" + os.path.join(TMP, "dry"))
check("1 cut to" in r.stdout, "--dry-run counts the conversation cut (%s)" % r.stdout.strip().splitlines()[-1])

# ---- completion: TRL's prompt/completion mask ----
pairs = [{"prompt": "The capital of France is", "completion": " Paris."},
         {"prompt": "2 + 2 =", "completion": " 4<|endoftext|>"}]  # already ended: no second one
comp = os.path.join(TMP, "comp.jsonl")
with open(comp, "w") as f:
    for p in pairs:
        f.write(json.dumps(p) + "\n")
got = rows("--set", "data.format=completion", "--set", "data.train_path=" + comp)
for i, p in enumerate(pairs):
    completion = p["completion"] if p["completion"].endswith("<|endoftext|>") else p["completion"] + "<|endoftext|>"
    prompt_ids = hf(p["prompt"])["input_ids"]
    ids = hf(p["prompt"] + completion)["input_ids"]
    inputs, targets = want_row(ids, [0] * len(prompt_ids) + [1] * (len(ids) - len(prompt_ids)))
    check(got[i]["ids"] == inputs and got[i]["targets"] == targets,
          "completion %d: tokenizer(prompt + completion + eos), the completion's tokens counted" % i)

# ---- malformed lines ----
for line, says in [('{"messages": []}', ":1: messages: expected a non-empty array of messages"),
                   ('{"messages": [{"role": "user"}]}', ":1: messages[0].content: expected a string, got nothing"),
                   ('{"messages": [{"role": "robot", "content": "x"}]}',
                    ':1: messages[0].role: expected system, user or assistant, got "robot"'),
                   ('{"messages": [{"role": "user", "content": "x"}]}', ":1: messages: no assistant message"),
                   ('{"messages": [', ":1: not JSON: "),
                   ('[1]', ":1: expected a JSON object"),
                   ('', ": empty file")]:
    with open(chat, "w") as f:
        f.write(line + ("\n" if line else ""))
    r = dtrain("data", "show", "--config", cfg, want=2)
    check(chat + says in r.stderr, "%r: exit 2 naming %s (%s)" % (line, says, r.stderr.strip()[-160:]))
with open(comp, "w") as f:
    f.write('{"prompt": "a", "completion": "b"}\n\n')
r = dtrain("data", "show", "--config", cfg, "--set", "data.format=completion", "--set", "data.train_path=" + comp, want=2)
check(comp + ":2: empty line" in r.stderr, "an empty line: exit 2 naming it (%s)" % r.stderr.strip())
r = dtrain("--config", cfg, "--dry-run", "--set", "data.tokenizer=bytes", "--set", "model.vocab_size=257", want=2)
check("data.format: chat needs the model's BPE tokenizer, but data.tokenizer is bytes" in r.stderr,
      "chat with the byte tokenizer: exit 2 (%s)" % r.stderr.strip())
r = dtrain("--config", cfg, "--dry-run", "--set", "data.format=tokens", "--set", "data.train_on=all", want=2)
check("data.train_on: applies to data.format chat and completion" in r.stderr,
      "data.train_on with token shards: exit 2 (%s)" % r.stderr.strip())

# ---- training: the loss over the answers of the whole global batch, any layout ----
try:
    import numpy as np
    from safetensors.numpy import load_file, save_file
    sys.path.insert(0, os.path.join(SRC, "tests"))
    import llama_ref as ref
except ImportError as e:
    print("SKIP (training checks): %s" % e)
    np = None
if np is not None:
    CFG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": 24,
           "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "hidden_act": "silu", "rope_scaling": None}
    rng = np.random.default_rng(5)
    W0 = {"model.embed_tokens.weight": rng.standard_normal((V, 24)).astype(np.float32) * 0.3,
          "model.norm.weight": np.ones(24, np.float32)}
    for l in range(2):
        p = "model.layers.%d." % l
        for name, shape in [("self_attn.q_proj", (32, 24)), ("self_attn.k_proj", (16, 24)), ("self_attn.v_proj", (16, 24)),
                            ("self_attn.o_proj", (24, 32)), ("mlp.gate_proj", (40, 24)), ("mlp.up_proj", (40, 24)),
                            ("mlp.down_proj", (24, 40))]:
            W0[p + name + ".weight"] = (rng.standard_normal(shape) * 0.15).astype(np.float32)
        W0[p + "input_layernorm.weight"] = np.ones(24, np.float32)
        W0[p + "post_attention_layernorm.weight"] = np.ones(24, np.float32)
    model = os.path.join(TMP, "model")
    shutil.copytree(tok_dir, model)
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(CFG, f)
    save_file(W0, os.path.join(model, "model.safetensors"), metadata={"format": "pt"})
    words = corpus[0].split() + corpus[1].split() + ["the", "cat", "sat"]
    train = os.path.join(TMP, "train.jsonl")
    with open(train, "w") as f:  # answers of very different lengths: per-worker means would differ
        for i in range(16):
            q = " ".join(words[(3 * i + k) % len(words)] for k in range(3 + i % 4))
            a = " ".join(words[(5 * i + k) % len(words)] for k in range(1 + (7 * i) % 11))
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
    yaml = os.path.join(TMP, "train.yaml")
    with open(yaml, "w") as f:
        f.write("data:\n  train_path: %s\n  format: chat\n  seq_len: 128\n  shuffle: false\nmodel:\n  init_from: %s\n"
                "optimizer:\n  lr: 0.01\n  schedule: constant\n  weight_decay: 0.0\ntraining:\n  max_steps: 3\n"
                "  device: cpu\neval:\n  every_steps: 0\ncheckpoint:\n  every_steps: 0\n" % (train, model))
    r = dtrain("--config", yaml, "--dry-run")
    check("# data: train: 16 conversations in 1 file(s), " in r.stdout and "targets counted in the loss (the answers')"
          in r.stdout, "--dry-run counts the conversations, tokens and counted targets")
    r = dtrain("--config", yaml, "--dry-run", "--set", "data.seq_len=64")
    check("16 cut to data.seq_len + 1 = 65 tokens, 16 left out (no answer token within them)" in r.stdout,
          "--dry-run counts the conversations whose answer starts past seq_len (%s)" % r.stdout.splitlines()[-1])
    r = dtrain("--config", yaml, "--set", "data.seq_len=64", "--set", "run.dir=" + os.path.join(TMP, "none"), want=2)
    check("16 of the 16 read were left out, their answer starting past data.seq_len (64) tokens" in r.stderr,
          "training on them exits 2 saying why (%s)" % r.stderr.strip()[-200:])
    shown = [json.loads(l) for l in dtrain("data", "show", "--config", yaml, "--json", "--limit", "4").stdout.splitlines()]
    ids = np.array([r["ids"] for r in shown])
    tgt = np.array([r["targets"] for r in shown])
    want = float(ref.mean_lm_loss({k: v.astype(np.float64) for k, v in W0.items()}, CFG, ids, tgt))
    import autograd  # the gradient's norm: the loss's scale is what AdamW's update hides
    names = sorted(W0)
    g = autograd.grad(lambda flat: ref.mean_lm_loss(dict(zip(names, flat)), CFG, ids, tgt))(
        [W0[k].astype(np.float64) for k in names])
    want_norm = float(np.sqrt(sum(float(np.sum(x * x)) for x in g)))
    runs = {}
    for workers, b, accum in [(1, 4, 1), (2, 2, 1), (4, 1, 1), (2, 1, 2)]:
        run = os.path.join(TMP, "run-%dx%dx%d" % (workers, b, accum))
        dtrain("--config", yaml, "--set", "run.dir=" + run, "--set", "training.num_workers=%d" % workers,
               "--set", "data.batch_size_per_worker=%d" % b, "--set", "training.grad_accum_steps=%d" % accum,
               "--quiet", "--progress", "never")
        steps = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if '"type":"train"' in l]
        runs[(workers, b, accum)] = load_file(os.path.join(run, "model.safetensors"))
        loss, norm = steps[0]["loss"], steps[0]["grad_norm"]
        check(abs(loss - want) <= 1e-5 * abs(want) and abs(norm - want_norm) <= 1e-4 * want_norm,
              "%d worker(s) x %d x %d micro-batch(es): step 1's loss and its gradient's norm are those of the mean over "
              "the global batch's answer tokens, as transformers' with labels -100 (%.7f, %.6f; reference %.7f, %.6f)"
              % (workers, b, accum, loss, norm, want, want_norm))
    # ---- exact match of greedy answers: dtrain eval against the numpy model's greedy decoding ----
    facts = [("What is the capital of France?", "Paris."), ("Colour of the sky?", "Blue."),
             ("Two plus two?", "Four."), ("Say hello.", "Hello there!")]
    mem = os.path.join(TMP, "facts.jsonl")
    with open(mem, "w") as f:
        for _ in range(4):
            for q, a in facts:
                f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
    val = os.path.join(TMP, "facts-val.jsonl")
    with open(val, "w") as f:
        for q, a in facts:
            f.write(json.dumps({"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}) + "\n")
    taught = os.path.join(TMP, "taught")
    dtrain("--config", yaml, "--set", "run.dir=" + taught, "--set", "data.train_path=" + mem, "--set",
           "training.max_steps=60", "--set", "data.batch_size_per_worker=4", "--quiet", "--progress", "never")
    end = hf.convert_tokens_to_ids("<|im_end|>")

    def greedy(W, conv):
        ids = hf.apply_chat_template(conv[:-1], add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        n = len(hf(conv[-1]["content"])["input_ids"]) + 16
        out = []
        for _ in range(n):
            nxt = int(np.argmax(ref.logits(W, CFG, np.array([ids + out]))[0, -1]))
            if nxt in (end, EOT):
                break
            out.append(nxt)
        return hf.decode(out)

    for name, W in [("the untrained model", W0), ("the taught model", load_file(os.path.join(taught, "model.safetensors")))]:
        W64 = {k: v.astype(np.float64) for k, v in W.items()}
        want = sum(greedy(W64, [{"role": "user", "content": q}, {"role": "assistant", "content": a}]).strip() == a
                   for q, a in facts)
        src = model if W is W0 else taught
        r = dtrain("eval", "--checkpoint", src, "--set", "data.val_path=" + val, "--set", "data.format=chat")
        line = [l for l in r.stdout.splitlines() if l.startswith("exact match: ") and " of 4 greedy" in l]
        check(bool(line) and line[0].startswith("exact match: %d of 4 greedy answers" % want) and
              (want >= 3 or W is W0),
              "dtrain eval of %s: exact match of greedy answers as the numpy model's greedy decoding (%d of 4): %s"
              % (name, want, line[0] if line else r.stdout[-300:]))
        if W is W0:
            check('not matched: question 1: expected "Paris.", generated "' in r.stdout,
                  "a mismatch is shown with what was expected and generated")
    base = runs[(1, 4, 1)]
    for key, W in runs.items():
        err = max(float(np.max(np.abs(W[k] - base[k]))) for k in base)
        check(err <= 1e-5, "%d worker(s) x %d x %d micro-batch(es): 3 steps give the weights of 1 worker x 4 within "
              "1e-5 (%.2e)" % (key + (err,)))

    # ---- packing: several conversations a row, attention within each one, positions restarting ----
    r = dtrain("--config", yaml, "--dry-run", "--set", "data.packing=true", "--set", "data.seq_len=400")
    m = re.search(r"packed into (\d+) rows of 400: padding ([\d.]+)% of their tokens \(one example a row: ([\d.]+)%\)",
                  r.stdout)
    check(bool(m) and m.group(1) == "4" and float(m.group(2)) < 10 and float(m.group(3)) > 70,
          "--dry-run: the 16 conversations pack into 4 rows of 400, and the padding before and after (%s)"
          % (m.group(0) if m else r.stdout.strip()[-300:]))
    r = dtrain("--config", yaml, "--dry-run", "--set", "data.format=tokens", "--set", "data.packing=true", want=2)
    check("data.packing: applies to data.format chat and completion" in r.stderr,
          "data.packing with token shards: exit 2 (%s)" % r.stderr.strip())
    whole = os.path.join(TMP, "unpacked-all")  # every conversation in one batch, one a row
    # lr 1e-3: AdamW makes a rounding in a tiny gradient (the same gradients summed in another order)
    # up to ~lr of its step; at the other runs' 1e-2 one element of 3 steps moves by 2.5e-5
    dtrain("--config", yaml, "--set", "run.dir=" + whole, "--set", "data.batch_size_per_worker=16", "--set",
           "optimizer.lr=0.001", "--quiet", "--progress", "never")
    step1 = [json.loads(l) for l in open(os.path.join(whole, "metrics.jsonl")) if '"type":"train"' in l][0]
    base_loss, base_norm = step1["loss"], step1["grad_norm"]
    base = load_file(os.path.join(whole, "model.safetensors"))
    packed1 = None
    # pp 2: the model's two layers as two pipeline stages (1F1B: a micro-batch's backward after later
    # forwards, its positions kept with its activations)
    for workers, b, accum, pp in [(1, 4, 1, 1), (2, 2, 1, 1), (4, 1, 1, 1), (2, 1, 2, 1), (2, 1, 4, 2), (4, 1, 2, 2)]:
        run = os.path.join(TMP, "packed-%dx%dx%d" % (workers, b, accum) + ("-p%d" % pp if pp > 1 else ""))
        r = dtrain("--config", yaml, "--set", "run.dir=" + run, "--set", "data.packing=true", "--set", "data.seq_len=400",
                   "--set", "training.num_workers=%d" % workers, "--set", "data.batch_size_per_worker=%d" % b,
                   "--set", "training.grad_accum_steps=%d" % accum, "--set", "training.pipeline_parallel=%d" % pp,
                   "--set", "optimizer.lr=0.001", "--quiet", "--progress", "never")
        step1 = [json.loads(l) for l in open(os.path.join(run, "metrics.jsonl")) if '"type":"train"' in l][0]
        loss, norm = step1["loss"], step1["grad_norm"]
        W = load_file(os.path.join(run, "model.safetensors"))
        packed1 = packed1 or W
        err = max(float(np.max(np.abs(W[k] - base[k]))) for k in base)
        same = max(float(np.max(np.abs(W[k] - packed1[k]))) for k in base)
        check(abs(loss - base_loss) <= 1e-5 * abs(base_loss) and abs(norm - base_norm) <= 1e-5 * base_norm and
              err <= 1e-5 and same <= 1e-5,
              "packed, %d worker(s)%s x %d x %d micro-batch(es): step 1's loss and gradient norm are the unpacked "
              "run's (%.7f %.6f, unpacked %.7f %.6f); after 3 steps its weights within 1e-5 (%.2e), those of 1 packed "
              "worker x 4 within 1e-5 (%.2e)" % (workers, " (%d pipeline stages)" % pp if pp > 1 else "", b, accum,
                                                 loss, norm, base_loss, base_norm, err, same))

    # evaluation reads packed rows too: the same loss on the answers as one conversation a row
    val = os.path.join(TMP, "packed-val.jsonl")
    with open(train) as f, open(val, "w") as g:
        g.writelines(f.readlines()[:8])
    got = {}
    for p in ("true", "false"):
        r = dtrain("eval", "--checkpoint", os.path.join(TMP, "packed-1x4x1"), "--set", "data.val_path=" + val,
                   "--set", "data.packing=" + p, "--set", "data.seq_len=400")
        m = re.search(r"val loss ([0-9.]+)", r.stdout)
        got[p] = float(m.group(1)) if m else float("nan")
    check(abs(got["true"] - got["false"]) <= 1e-5 * abs(got["false"]),
          "dtrain eval with data.packing: the loss of one conversation a row (%.7f, unpacked %.7f)"
          % (got["true"], got["false"]))

if failures:
    print("test_sft: %d check(s) failed" % len(failures))
    sys.exit(1)
print("test_sft: ok")
