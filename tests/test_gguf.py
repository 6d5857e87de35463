#!/usr/bin/env python3
"""test_gguf.py SRC TMP — scripts/gguf-to-hf.py on synthetic Llama GGUF files (no download).

Writes tiny Llama models with gguf's GGUFWriter the way llama.cpp's convert_hf_to_gguf.py does
(q_proj/k_proj rows permuted by its LlamaModel.permute, with n_head for q and n_head_kv for k;
some tensors F32, some F16, Q8_0 or Q4_1 through gguf.quants.quantize; a byte-level BPE vocabulary
with merges, control and user-defined tokens, and a chat template in the metadata), converts them,
and checks:
  - model.safetensors holds exactly Hugging Face's LlamaForCausalLM names and shapes, in F32, and
    every tensor equals the Hugging Face original: exactly for F32, and for a quantized one exactly
    the quantization's own dequantized value of the original (blocks run along rows and the
    permutation moves whole rows, so that oracle needs no inverse permutation);
  - transformers' AutoConfig / LlamaConfig read config.json with the right fields;
  - transformers' AutoTokenizer loads the directory and encodes like
    tokenizers.Tokenizer.from_file(tokenizer.json), with the pre-tokenizer the GGUF names (smollm:
    digits one by one; gpt-2: not), special tokens kept whole, add_bos_token honoured;
  - apply_chat_template renders the carried template;
  - bad inputs (a missing file, not a GGUF, a truncated one, another architecture, a missing key,
    an unknown tokenizer pre-tokenizer, a tensor whose shape disagrees) exit 2 naming the file.
Exit 77 (skip) when numpy, gguf (with gguf.quants), tokenizers, transformers or jinja2 are missing.
"""
import json
import os
import shutil
import struct
import subprocess
import sys

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as QT
    from gguf.quants import quantize, dequantize
    import jinja2  # noqa: F401  (apply_chat_template needs it)
    from tokenizers import Tokenizer
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    from transformers import AutoConfig, AutoTokenizer, LlamaConfig
except ImportError as e:
    print("SKIP: %s (needs numpy, gguf, tokenizers, transformers and jinja2)" % e)
    sys.exit(77)

SRC, TMP = sys.argv[1], os.path.join(sys.argv[2], "gguf")
SCRIPT = os.path.join(SRC, "scripts", "gguf-to-hf.py")
shutil.rmtree(TMP, ignore_errors=True)
os.makedirs(TMP)
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)
    return cond


# --- the synthetic model --------------------------------------------------------------------------

N_LAYER, HIDDEN, N_HEAD, N_KV, HEAD_DIM, INTER, CTX = 2, 32, 4, 2, 8, 64, 256
EPS, THETA = 1e-5, 100000.0
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\\nYou are a tiny test model<|im_end|>\\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def byte_alphabet():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def vocabulary():
    """(tokens, token types, merges): 3 control tokens, the 256 byte symbols, merged tokens, one
    user-defined token."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [3, 3, 3]
    tokens += byte_alphabet()
    types += [1] * 256
    merges = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "1 2", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld",
              "u s", "us er", "a s", "as s", "ass i", "assi s", "assis t"]
    for m in merges:
        tokens.append(m.replace(" ", ""))
        types.append(1)
    tokens.append("<think>")
    types.append(4)
    return tokens, types, merges


TOKENS, TYPES, MERGES = vocabulary()
VOCAB = len(TOKENS)
TID = {t: i for i, t in enumerate(TOKENS)}


def llama_cpp_permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim in numpy."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2)
            .reshape(w.shape))


def hf_weights(seed, tied):
    rng = np.random.default_rng(seed)
    W = {"model.embed_tokens.weight": rng.standard_normal((VOCAB, HIDDEN)),
         "model.norm.weight": 1 + 0.1 * rng.standard_normal(HIDDEN)}
    if not tied:
        W["lm_head.weight"] = rng.standard_normal((VOCAB, HIDDEN))
    for i in range(N_LAYER):
        p = "model.layers.%d." % i
        W[p + "self_attn.q_proj.weight"] = rng.standard_normal((N_HEAD * HEAD_DIM, HIDDEN))
        W[p + "self_attn.k_proj.weight"] = rng.standard_normal((N_KV * HEAD_DIM, HIDDEN))
        W[p + "self_attn.v_proj.weight"] = rng.standard_normal((N_KV * HEAD_DIM, HIDDEN))
        W[p + "self_attn.o_proj.weight"] = rng.standard_normal((HIDDEN, N_HEAD * HEAD_DIM))
        W[p + "mlp.gate_proj.weight"] = rng.standard_normal((INTER, HIDDEN))
        W[p + "mlp.up_proj.weight"] = rng.standard_normal((INTER, HIDDEN))
        W[p + "mlp.down_proj.weight"] = rng.standard_normal((HIDDEN, INTER))
        W[p + "input_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(HIDDEN)
        W[p + "post_attention_layernorm.weight"] = 1 + 0.1 * rng.standard_normal(HIDDEN)
    return {k: (0.05 * v if v.ndim == 2 else v).astype(np.float32) for k, v in W.items()}


GGUF_NAME = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}


def to_gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    p = hf.split(".")  # model.layers.N.<module>.weight, <module> one or two parts
    return "blk.%s.%s.weight" % (p[2], GGUF_NAME[".".join(p[3:-1])])


# which type each tensor is stored in (the rest F32): a mix, q/k in several types
QTYPES = {
    "model.embed_tokens.weight": QT.Q8_0,
    "lm_head.weight": QT.Q4_1,
    "model.layers.0.self_attn.q_proj.weight": QT.Q4_1,
    "model.layers.0.self_attn.k_proj.weight": QT.Q8_0,
    "model.layers.0.self_attn.v_proj.weight": QT.Q4_1,
    "model.layers.0.mlp.gate_proj.weight": QT.Q4_1,
    "model.layers.0.mlp.down_proj.weight": QT.Q8_0,
    "model.layers.1.self_attn.k_proj.weight": QT.Q4_1,
    "model.layers.1.self_attn.v_proj.weight": QT.F16,
    "model.layers.1.mlp.up_proj.weight": QT.Q8_0,
}


def expected_value(name, w):
    """What the converter must give back for the Hugging Face tensor w."""
    qt = QTYPES.get(name, QT.F32)
    if qt == QT.F32:
        return w
    if qt == QT.F16:
        return w.astype(np.float16).astype(np.float32)
    return dequantize(quantize(w, qt), qt).reshape(w.shape).astype(np.float32)


def write_gguf(path, W, arch="llama", pre="smollm", add_bos=False, drop_keys=(), extra=None, shape_break=None):
    w = gguf.GGUFWriter(path, arch)
    kv = {
        "block_count": lambda: w.add_block_count(N_LAYER),
        "context_length": lambda: w.add_context_length(CTX),
        "embedding_length": lambda: w.add_embedding_length(HIDDEN),
        "feed_forward_length": lambda: w.add_feed_forward_length(INTER),
        "head_count": lambda: w.add_head_count(N_HEAD),
        "head_count_kv": lambda: w.add_head_count_kv(N_KV),
        "freq_base": lambda: w.add_rope_freq_base(THETA),
        "rms_eps": lambda: w.add_layer_norm_rms_eps(EPS),
        "vocab_size": lambda: w.add_vocab_size(VOCAB),
        "rope_dim": lambda: w.add_rope_dimension_count(HEAD_DIM),
        "file_type": lambda: w.add_file_type(3),
        "tok_model": lambda: w.add_tokenizer_model("gpt2"),
        "tok_pre": lambda: w.add_tokenizer_pre(pre),
        "tokens": lambda: w.add_token_list(TOKENS),
        "token_types": lambda: w.add_token_types(TYPES),
        "merges": lambda: w.add_token_merges(MERGES),
        "bos": lambda: w.add_bos_token_id(TID["<|im_start|>"]),
        "eos": lambda: w.add_eos_token_id(TID["<|im_end|>"]),
        "unk": lambda: w.add_unk_token_id(TID["<|endoftext|>"]),
        "pad": lambda: w.add_pad_token_id(TID["<|im_end|>"]),
        "add_bos": lambda: w.add_add_bos_token(add_bos),
        "template": lambda: w.add_chat_template(TEMPLATE),
    }
    for k, f in kv.items():
        if k not in drop_keys:
            f()
    for k, v in (extra or {}).items():
        w.add_string(k, v)
    for name in sorted(W):
        a = W[name]
        if name.endswith("q_proj.weight"):
            a = llama_cpp_permute(a, N_HEAD, N_HEAD)
        elif name.endswith("k_proj.weight"):
            a = llama_cpp_permute(a, N_HEAD, N_KV)
        if name == shape_break:
            a = a[:-2]
        qt = QTYPES.get(name, QT.F32)
        if qt == QT.F32:
            w.add_tensor(to_gguf_name(name), np.ascontiguousarray(a, dtype=np.float32))
        elif qt == QT.F16:
            w.add_tensor(to_gguf_name(name), np.ascontiguousarray(a, dtype=np.float16))
        else:
            w.add_tensor(to_gguf_name(name), quantize(np.ascontiguousarray(a), qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def convert(src, out):
    return subprocess.run([sys.executable, SCRIPT, src, out], capture_output=True, text=True, timeout=120)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out, dtypes = {}, set()
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtypes.add(info["dtype"])
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[a:b], dtype="<f4").reshape(info["shape"])
    return out, dtypes, header.get("__metadata__")


def check_weights(tag, out, W):
    got, dtypes, meta = read_safetensors(os.path.join(out, "model.safetensors"))
    check(dtypes == {"F32"}, "%s: safetensors dtypes %s, not F32" % (tag, dtypes))
    check(isinstance(meta, dict) and meta.get("format") == "pt", "%s: __metadata__.format is not \"pt\": %s" % (tag, meta))
    check(set(got) == set(W), "%s: tensor names differ: extra %s, missing %s"
          % (tag, sorted(set(got) - set(W)), sorted(set(W) - set(got))))
    for name in sorted(set(got) & set(W)):
        if not check(got[name].shape == W[name].shape, "%s: %s has shape %s, not %s"
                     % (tag, name, got[name].shape, W[name].shape)):
            continue
        want = expected_value(name, W[name])
        qt = QTYPES.get(name, QT.F32).name
        check(np.array_equal(got[name], want), "%s: %s (%s) differs from the original: max |diff| %.3g"
              % (tag, name, qt, np.abs(got[name] - want).max()))
    # the oracle is not vacuous: permuting changes q and k, and quantizing changes the values
    q = W["model.layers.0.self_attn.q_proj.weight"]
    check(not np.array_equal(llama_cpp_permute(q, N_HEAD, N_HEAD), q), "the test's permutation is the identity")
    e = W["model.embed_tokens.weight"]
    check(not np.array_equal(expected_value("model.embed_tokens.weight", e), e), "Q8_0 left the values unchanged")


def check_config(tag, out, tied, bos, eos, pad):
    for loader in (AutoConfig, LlamaConfig):
        c = loader.from_pretrained(out)
        rope = getattr(c, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(c, "rope_theta", None))
        got = {"model_type": c.model_type, "architectures": c.architectures, "hidden_size": c.hidden_size,
               "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
               "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim,
               "intermediate_size": c.intermediate_size, "vocab_size": c.vocab_size,
               "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
               "rope_theta": theta, "tie_word_embeddings": c.tie_word_embeddings, "bos_token_id": c.bos_token_id,
               "eos_token_id": c.eos_token_id, "pad_token_id": c.pad_token_id, "hidden_act": c.hidden_act,
               "attention_bias": c.attention_bias, "mlp_bias": c.mlp_bias}
        want = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": HIDDEN,
                "num_hidden_layers": N_LAYER, "num_attention_heads": N_HEAD, "num_key_value_heads": N_KV,
                "head_dim": HEAD_DIM, "intermediate_size": INTER, "vocab_size": VOCAB,
                "max_position_embeddings": CTX, "rms_norm_eps": EPS, "rope_theta": THETA,
                "tie_word_embeddings": tied, "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad,
                "hidden_act": "silu", "attention_bias": False, "mlp_bias": False}
        for k in want:
            check(got[k] == want[k], "%s: %s.%s is %r, not %r" % (tag, loader.__name__, k, got[k], want[k]))
        rs = rope.get("rope_type", "default") if rope else (getattr(c, "rope_scaling", None) or {}).get("rope_type", "default")
        check(rs == "default", "%s: rope type %r, not default" % (tag, rs))


def ids_of(*toks):
    return [TID[t] for t in toks]


def check_tokenizer(tag, out, pre, add_bos):
    tok = AutoTokenizer.from_pretrained(out)
    raw = Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
    with open(os.path.join(out, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    check(tj["normalizer"] is None, "%s: normalizer %r" % (tag, tj["normalizer"]))
    check(tok.bos_token == "<|im_start|>" and tok.eos_token == "<|im_end|>" and tok.pad_token == "<|im_end|>"
          and tok.unk_token == "<|endoftext|>", "%s: special tokens bos %r eos %r pad %r unk %r"
          % (tag, tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token))
    check(tok.model_max_length == CTX, "%s: model_max_length %r" % (tag, tok.model_max_length))
    check(len(tok) == VOCAB, "%s: len(tokenizer) %d, not %d" % (tag, len(tok), VOCAB))
    texts = ["the world", " the world 12", "user 1234 is in", "<|im_start|>user\nhi there<|im_end|>\n",
             "a<think>b", "Café 1.5 ass assist", ""]
    for t in texts:
        a = tok(t).input_ids
        b = raw.encode(t).ids
        check(a == b, "%s: AutoTokenizer gives %s for %r, tokenizers %s" % (tag, a, t, b))
        check(tok.decode(a, skip_special_tokens=False) == (tok.bos_token if add_bos else "") + t,
              "%s: decode(encode(%r)) is %r" % (tag, t, tok.decode(a, skip_special_tokens=False)))
    bos = ids_of("<|im_start|>") if add_bos else []
    # merges apply (" the" is one token, " world" too); digits split one by one under smollm, not gpt-2
    want_digits = ids_of("Ġ", "1", "2") if pre == "smollm" else ids_of("Ġ", "12")
    check(tok(" the world 12").input_ids == bos + ids_of("Ġthe", "Ġworld") + want_digits,
          "%s: ' the world 12' -> %s" % (tag, tok(" the world 12").input_ids))
    # control tokens stay whole and special; the user-defined one stays whole but is not special
    check(tok("<|im_start|>user<|im_end|>").input_ids == bos + ids_of("<|im_start|>", "user", "<|im_end|>"),
          "%s: specials split: %s" % (tag, tok("<|im_start|>user<|im_end|>").input_ids))
    check(tok("<think>").input_ids == bos + ids_of("<think>"), "%s: <think> split: %s" % (tag, tok("<think>").input_ids))
    check(tok.decode(ids_of("<|im_start|>", "<think>", "<|im_end|>"), skip_special_tokens=True) == "<think>",
          "%s: skip_special_tokens gives %r" % (tag, tok.decode(ids_of("<|im_start|>", "<think>", "<|im_end|>"),
                                                                  skip_special_tokens=True)))
    msgs = [{"role": "user", "content": "the world 12"}]
    text = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    want = ("<|im_start|>system\nYou are a tiny test model<|im_end|>\n<|im_start|>user\nthe world 12<|im_end|>\n"
            "<|im_start|>assistant\n")
    check(text == want, "%s: chat template renders %r" % (tag, text))
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    check(list(ids) == raw.encode(want, add_special_tokens=False).ids,
          "%s: templated ids %s differ from tokenizers' %s" % (tag, list(ids), raw.encode(want).ids))


# --- 1. a SmolLM2-like model: tied embeddings, smollm pre-tokenizer -------------------------------

W1 = hf_weights(1, tied=True)
g1, o1 = os.path.join(TMP, "tied.gguf"), os.path.join(TMP, "tied-hf")
write_gguf(g1, W1)
r = convert(g1, o1)
if check(r.returncode == 0, "tied: gguf-to-hf.py exited %d: %s" % (r.returncode, r.stderr)):
    check("dequantizing" in r.stderr, "tied: no progress lines on stderr: %r" % r.stderr)
    check_weights("tied", o1, W1)
    check_config("tied", o1, True, TID["<|im_start|>"], TID["<|im_end|>"], TID["<|im_end|>"])
    check_tokenizer("tied", o1, "smollm", False)
    with open(os.path.join(o1, "tokenizer_config.json"), encoding="utf-8") as f:
        tc = json.load(f)
    check(tc.get("chat_template") == TEMPLATE, "tied: tokenizer_config.json chat_template differs")
    # converting again replaces the files with the same bytes
    r2 = convert(g1, o1)
    check(r2.returncode == 0, "tied: second conversion exited %d" % r2.returncode)

# --- 2. a separate lm_head, the gpt-2 pre-tokenizer, add_bos_token ---------------------------------

W2 = hf_weights(2, tied=False)
g2, o2 = os.path.join(TMP, "untied.gguf"), os.path.join(TMP, "untied-hf")
write_gguf(g2, W2, pre="gpt-2", add_bos=True)
r = convert(g2, o2)
if check(r.returncode == 0, "untied: gguf-to-hf.py exited %d: %s" % (r.returncode, r.stderr)):
    check_weights("untied", o2, W2)
    check_config("untied", o2, False, TID["<|im_start|>"], TID["<|im_end|>"], TID["<|im_end|>"])
    check_tokenizer("untied", o2, "gpt-2", True)

# --- 3. bad inputs exit 2 naming the file ----------------------------------------------------------


def bad(tag, path, *needles):
    out = os.path.join(TMP, tag + "-hf")
    r = convert(path, out)
    msg = r.stderr.strip()
    ok = check(r.returncode == 2, "%s: exit %d, not 2 (stderr %r)" % (tag, r.returncode, msg))
    ok = ok and check(path in msg, "%s: the message does not name %s: %r" % (tag, path, msg))
    for n in needles:
        ok = ok and check(n in msg, "%s: the message lacks %r: %r" % (tag, n, msg))
    check("Traceback" not in msg, "%s: a traceback instead of a message: %r" % (tag, msg))
    if ok:
        print("ok: %s -> %s" % (tag, msg.splitlines()[-1]))


bad("missing", os.path.join(TMP, "no-such.gguf"), "no such file")
p = os.path.join(TMP, "text.gguf")
with open(p, "w") as f:
    f.write("this is not a GGUF file\n")
bad("not-gguf", p, "not a GGUF")
p = os.path.join(TMP, "truncated.gguf")
with open(g1, "rb") as f, open(p, "wb") as g:
    g.write(f.read(3000))
bad("truncated", p)
p = os.path.join(TMP, "arch.gguf")
write_gguf(p, W1, arch="gpt2")
bad("architecture", p, "general.architecture", "gpt2")
p = os.path.join(TMP, "nokey.gguf")
write_gguf(p, W1, drop_keys=("head_count",))
bad("missing-key", p, "llama.attention.head_count")
p = os.path.join(TMP, "pre.gguf")
write_gguf(p, W1, pre="qwen2")
bad("unknown-pre", p, "tokenizer.ggml.pre", "qwen2")
p = os.path.join(TMP, "shape.gguf")
write_gguf(p, W1, shape_break="model.layers.1.mlp.gate_proj.weight")
bad("shape", p, "blk.1.ffn_gate.weight")
r = subprocess.run([sys.executable, SCRIPT], capture_output=True, text=True)
check(r.returncode == 2 and "usage" in r.stderr, "no arguments: exit %d %r" % (r.returncode, r.stderr))

if failures:
    print("%d failure(s)" % len(failures))
    sys.exit(1)
print("ok: gguf-to-hf.py (tied/smollm and untied/gpt-2 models, bad inputs)")
