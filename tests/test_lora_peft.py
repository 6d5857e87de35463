#!/usr/bin/env python3
"""test_lora_peft.py DTRAIN SRC TMP — model.lora against an independent implementation: the numpy
forward of tests/llama_ref.py (transformers' LlamaForCausalLM, float64) with PEFT's LoRA
(each targeted Linear's output plus lora_alpha / r * B A x), differentiated by autograd.

A random Llama-family Hugging Face directory (grouped-query attention, an untied head) is the
frozen base; a PEFT adapter directory written here (adapter_config.json, adapter_model.safetensors
under PEFT's names, B not zero) on q, k, v, o, gate, up and down is model.lora.init_from:
- `dtrain predict` of a 0-step run gives each line's mean loss as the reference with those
  adapters does, within 1e-5 relative (the adapted model's output: the logits' log-softmax);
- three AdamW steps over the adapters alone (weight decay, clipping; the base frozen) give the
  reference's adapters, on 1, 2 and 4 workers and 2 x 2 micro-batches, within 2e-5 absolute;
  the base is not in the run's weights file;
- `dtrain export --format peft` writes the trained adapters under PEFT's names with an
  adapter_config.json that reads back as the run's LoRA, and `--format hf` the merged model,
  whose predictions are the adapted model's (1e-5), and greedy generation (the key/value cache)
  through the adapters gives the merged model's text; a model without adapters has no PEFT export;
- an adapter_config.json that disagrees with model.lora, or that dtrain cannot apply (DoRA), is
  refused with exit 2 naming it.
Exit 77 without numpy, autograd or safetensors (scripts/test.sh installs them).
"""
import json
import os
import shutil
import sys

try:
    import numpy as np
    import autograd
    from safetensors.numpy import load_file, save_file
except ImportError as e:
    print("SKIP: %s (scripts/test.sh installs numpy, autograd and safetensors into build/venv)" % e)
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pyutil import check, dtrain, failures, start  # noqa: E402
DTRAIN, SRC, TMP = start("lora-peft")
import llama_ref as ref  # noqa: E402


CFG = ref.CFG
RANK, ALPHA = 4, 6.0
MODULES = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]
rng = np.random.default_rng(11)


def mat(*shape, std=0.15):
    return (rng.standard_normal(shape) * std).astype(np.float32)


W0 = ref.random_weights(CFG, 11)
HF = os.path.join(TMP, "base")
ref.write_dir(HF, CFG, W0)

# the adapters, under PEFT's names: A (r, in), B (out, r); B not zero, so they change the model
AD0 = {}
for l in range(CFG["num_hidden_layers"]):
    for m in MODULES:
        w = W0["model.layers.%d.%s.weight" % (l, m)]
        key = "base_model.model.model.layers.%d.%s" % (l, m)
        AD0[key + ".lora_A.weight"] = mat(RANK, w.shape[1], std=0.2)
        AD0[key + ".lora_B.weight"] = mat(w.shape[0], RANK, std=0.2)
PEFT = os.path.join(TMP, "peft")
os.makedirs(PEFT)
ADAPTER_CFG = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": HF, "r": RANK,
               "lora_alpha": ALPHA, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                       "down_proj"],
               "lora_dropout": 0.0, "fan_in_fan_out": False, "bias": "none", "modules_to_save": None,
               "rank_pattern": {}, "alpha_pattern": {}, "use_rslora": False, "use_dora": False}
with open(os.path.join(PEFT, "adapter_config.json"), "w") as f:
    json.dump(ADAPTER_CFG, f, indent=2)
save_file(AD0, os.path.join(PEFT, "adapter_model.safetensors"), metadata={"format": "pt"})


def ours(peft_name):
    return peft_name[len("base_model.model."):]


def adapted(W, AD):
    """the base with each adapter merged: W + alpha / r * B A (as PEFT's forward adds them)"""
    out = dict(W)
    for l in range(CFG["num_hidden_layers"]):
        for m in MODULES:
            key = "base_model.model.model.layers.%d.%s" % (l, m)
            name = "model.layers.%d.%s.weight" % (l, m)
            out[name] = W[name] + (ALPHA / RANK) * (AD[key + ".lora_B.weight"] @ AD[key + ".lora_A.weight"])
    return out


def as64(W):
    return {k: np.asarray(v, dtype=np.float64) for k, v in W.items()}


LORA = ["--set", "model.lora.rank=%d" % RANK, "--set", "model.lora.alpha=%g" % ALPHA,
        "--set", "model.lora.targets=[q, k, v, o, gate, up, down]", "--set", "model.lora.init_from=" + PEFT,
        "--set", "model.init_from=" + HF]

# ---- 1. the adapted model's output ----
lines = ["The quick brown fox jumps over the lazy dog.", "Adapters: a low-rank update on a frozen model.",
         "0123456789 " * 4, "\u00dcnic\u00f6de \u2014 r\u00e9sum\u00e9"]
text = os.path.join(TMP, "lines.txt")
with open(text, "w", encoding="utf-8") as f:
    f.write("\n".join(lines) + "\n")
T, B_GLOBAL, STEPS = 16, 4, 3
toks = rng.integers(0, 257, size=B_GLOBAL * STEPS * T + 1, dtype=np.int64)
shard = os.path.join(TMP, "train.bin")
ref.write_shard(shard, toks)
cfg_yaml = os.path.join(TMP, "lora.yaml")
with open(cfg_yaml, "w") as f:
    f.write("data:\n  train_path: x\n")
LR, BETAS, EPS, WD, CLIP = 3e-3, (0.9, 0.95), 1e-6, 0.1, 0.5
BASE_ARGS = ["--set", "data.train_path=" + shard, "--set", "data.format=tokens", "--set", "data.seq_len=%d" % T,
             "--set", "data.shuffle=false", "--set", "optimizer.lr=%g" % LR,
             "--set", "optimizer.betas=[%g,%g]" % BETAS, "--set", "optimizer.eps=%g" % EPS,
             "--set", "optimizer.weight_decay=%g" % WD, "--set", "optimizer.grad_clip=%g" % CLIP,
             "--set", "optimizer.schedule=constant", "--set", "training.device=cpu", "--set", "eval.every_steps=0",
             "--set", "checkpoint.every_steps=0", "--set", "fault_tolerance.max_restarts=0", "--quiet",
             "--progress", "never", *LORA]


def without(args, *prefixes):
    """args with the --set pairs of keys starting with prefixes left out"""
    out, i = [], 0
    while i < len(args):
        if args[i] == "--set" and i + 1 < len(args) and args[i + 1].startswith(prefixes):
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out


def predict_worst(checkpoint, W, name):
    """the worst relative difference of predict's per-line losses from the reference's with W (whole
    lines: seq_len 64, not the training's 16)"""
    out = os.path.join(TMP, "pred-%s.jsonl" % name)
    dtrain("predict", "--checkpoint", checkpoint, "--input", text, "--out", out, "--progress", "never",
           "--set", "data.seq_len=64")
    got = [json.loads(l) for l in open(out)]
    worst = 0.0
    for line, g in zip(lines, got):
        ids = np.array([list(line.encode("utf-8"))])
        want = float(ref.mean_lm_loss(as64(W), CFG, ids[:, :-1], ids[:, 1:]))
        worst = max(worst, abs(g["loss"] - want) / abs(want))
    return worst


run0 = os.path.join(TMP, "train-0")
dtrain("--config", cfg_yaml, "--set", "run.dir=" + run0, "--set", "training.max_steps=1",
       "--set", "optimizer.lr=1e-30", "--set", "optimizer.weight_decay=0",
       *without(BASE_ARGS, "optimizer.lr", "optimizer.weight_decay"))
base_worst = predict_worst(HF, W0, "base")
worst = predict_worst(run0, adapted(W0, AD0), "adapted")
moved = max(abs(float(ref.mean_lm_loss(as64(adapted(W0, AD0)), CFG, np.array([list(l.encode())[:-1]]),
                                       np.array([list(l.encode())[1:]]))) -
                float(ref.mean_lm_loss(as64(W0), CFG, np.array([list(l.encode())[:-1]]),
                                       np.array([list(l.encode())[1:]])))) for l in lines)
check(worst <= 1e-5, "predict with PEFT's adapters (model.lora.init_from, all 7 projections, GQA): each line's loss "
      "is the reference's within 1e-5 relative (worst %.2e; the adapters moved the losses by up to %.3f; the base "
      "alone %.2e)" % (worst, moved, base_worst))


# ---- 2. three AdamW steps over the adapters ----
def reference_steps():
    """AdamW over the adapters alone (the base frozen), as tests/test_llama.py's over a model"""
    names = sorted(AD0)
    W64 = as64(W0)

    def loss(flat, ids, tgt):
        return ref.mean_lm_loss(adapted(W64, dict(zip(names, flat))), CFG, ids, tgt)

    rows = [np.stack([toks[(s * B_GLOBAL + i) * T:(s * B_GLOBAL + i) * T + T + 1] for i in range(B_GLOBAL)])
            for s in range(STEPS)]
    return ref.adamw_steps(AD0, autograd.grad(loss), [(r[:, :-1], r[:, 1:]) for r in rows], LR, BETAS, EPS, WD, CLIP)


want = reference_steps()
# workers, micro-batches, tensor-parallel shares, pipeline stages
for workers, accum, tp, pp in [(1, 1, 1, 1), (2, 1, 1, 1), (4, 1, 1, 1), (2, 2, 1, 1), (2, 1, 2, 1), (4, 2, 2, 2)]:
    run = os.path.join(TMP, "train-%dx%d-t%dp%d" % (workers, accum, tp, pp))
    dtrain("--config", cfg_yaml, "--set", "run.dir=" + run, "--set", "training.num_workers=%d" % workers,
           "--set", "training.grad_accum_steps=%d" % accum, "--set", "training.max_steps=%d" % STEPS,
           "--set", "training.tensor_parallel=%d" % tp, "--set", "training.pipeline_parallel=%d" % pp,
           "--set", "data.batch_size_per_worker=%d" % (B_GLOBAL // (workers // tp // pp) // accum), *BASE_ARGS)
    got = load_file(os.path.join(run, "model.safetensors"))
    err = max(float(np.max(np.abs(got[ours(k)] - want[k]))) for k in want)
    moved = max(float(np.max(np.abs(want[k] - AD0[k]))) for k in want)
    check(sorted(got) == sorted(ours(k) for k in want) and err <= 2e-5,
          "%d worker(s) x %d micro-batch(es)%s: 3 AdamW steps on the adapters give the reference's within 2e-5 (worst "
          "%.2e; the steps moved them by up to %.2e); the weights file holds the adapters only" %
          (workers, accum, "" if tp * pp == 1 else ", %d tensor-parallel shares x %d pipeline stages" % (tp, pp), err,
           moved))
    if workers == 1:
        run1 = run

# ---- 3. export --format peft and --format hf ----
exp = os.path.join(TMP, "export-peft")
dtrain("export", "--checkpoint", run1, "--format", "peft", "--out", exp)
ac = json.load(open(os.path.join(exp, "adapter_config.json")))
ex = load_file(os.path.join(exp, "adapter_model.safetensors"))
check(ac["peft_type"] == "LORA" and ac["task_type"] == "CAUSAL_LM" and ac["r"] == RANK and ac["lora_alpha"] == ALPHA
      and sorted(ac["target_modules"]) == sorted(MODULES) and ac["base_model_name_or_path"] == HF
      and ac["fan_in_fan_out"] is False, "export --format peft: adapter_config.json has the run's r, lora_alpha, "
      "target_modules and base")
check(sorted(ex) == sorted(want) and max(float(np.max(np.abs(ex[k] - load_file(os.path.join(run1, "model.safetensors"))
                                                              [ours(k)]))) for k in want) == 0.0,
      "export --format peft: adapter_model.safetensors holds the run's adapters, bit for bit, under PEFT's names")
# the export reads back as model.lora.init_from (a round trip through PEFT's format)
run_rt = os.path.join(TMP, "roundtrip")
dtrain("--config", cfg_yaml, "--set", "run.dir=" + run_rt, "--set", "training.max_steps=1", "--set",
       "model.lora.init_from=" + exp, "--set", "optimizer.lr=1e-30", "--set", "optimizer.weight_decay=0",
       *without(BASE_ARGS, "model.lora.init_from", "optimizer.lr", "optimizer.weight_decay"))
trained = {k: np.asarray(v, dtype=np.float64) for k, v in ex.items()}
worst = predict_worst(run_rt, adapted(W0, trained), "roundtrip")
check(worst <= 1e-5, "its adapters, read back through model.lora.init_from, predict as the reference (worst %.2e)" % worst)
# the same read by 2 tensor-parallel shares of 2 stages: each takes its part of every adapter
run_rt2 = os.path.join(TMP, "roundtrip-t2p2")
dtrain("--config", cfg_yaml, "--set", "run.dir=" + run_rt2, "--set", "training.max_steps=1", "--set",
       "model.lora.init_from=" + exp, "--set", "optimizer.lr=1e-30", "--set", "optimizer.weight_decay=0",
       "--set", "training.num_workers=4", "--set", "training.tensor_parallel=2", "--set", "training.pipeline_parallel=2",
       *without(BASE_ARGS, "model.lora.init_from", "optimizer.lr", "optimizer.weight_decay"))
worst = predict_worst(run_rt2, adapted(W0, trained), "roundtrip-t2p2")
check(worst <= 1e-5, "read through model.lora.init_from by 2 tensor-parallel shares x 2 stages, and saved again: "
      "they predict as the reference (worst %.2e)" % worst)
hf = os.path.join(TMP, "export-hf")
dtrain("export", "--checkpoint", run1, "--format", "hf", "--out", hf)
merged = load_file(os.path.join(hf, "model.safetensors"))
check(sorted(merged) == sorted(W0), "export --format hf: the model's tensors, the adapters merged into them")
worst = predict_worst(hf, adapted(W0, trained), "merged")
check(worst <= 1e-5, "export --format hf predicts as the adapted model (worst %.2e)" % worst)

# greedy generation (the key/value cache through the adapters) as from the merged model
gen = [dtrain("generate", "--checkpoint", c, "--prompt", "The quick", "--max-new-tokens", "24", "--temperature", "0").stdout
       for c in (run1, hf, HF)]
check(gen[0] == gen[1] and gen[0] != gen[2], "generate with the adapters gives the merged model's greedy text (not "
      "the base's)")

# ---- 4. refusals ----
r = dtrain("--config", cfg_yaml, "--set", "run.dir=" + os.path.join(TMP, "bad-rank"), *BASE_ARGS,
           "--set", "model.lora.rank=8", "--dry-run", want=2)
check("model.lora.init_from" in r.stderr and "adapter_config.json has r 4, lora_alpha 6" in r.stderr,
      "an adapter_config.json of another rank is refused, naming it: " + r.stderr.strip()[-200:])
dora = os.path.join(TMP, "dora")
shutil.copytree(PEFT, dora)
with open(os.path.join(dora, "adapter_config.json"), "w") as f:
    json.dump(dict(ADAPTER_CFG, use_dora=True), f)
r = dtrain("--config", cfg_yaml, "--set", "run.dir=" + os.path.join(TMP, "bad-dora"), *BASE_ARGS,
           "--set", "model.lora.init_from=" + dora, "--dry-run", want=2)
check("use_dora" in r.stderr, "a DoRA adapter is refused by name: " + r.stderr.strip()[-200:])
r = dtrain("--config", cfg_yaml, "--set", "run.dir=" + os.path.join(TMP, "bad-file"), *BASE_ARGS,
           "--set", "model.lora.init_from=" + os.path.join(HF, "model.safetensors"), want=2)
check("holds no LoRA adapters" in r.stderr, "a model's weights as model.lora.init_from are refused: " +
      r.stderr.strip()[-200:])
r = dtrain("export", "--checkpoint", HF, "--format", "peft", "--out", os.path.join(TMP, "x"), want=2)
check("was not trained with model.lora" in r.stderr and not os.path.exists(os.path.join(TMP, "x")),
      "export --format peft of a model without adapters is refused: " + r.stderr.strip()[-160:])

if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("test_lora_peft: ok")
