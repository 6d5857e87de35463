#!/usr/bin/env python3
"""gguf-to-hf.py GGUF OUT_DIR — a Llama-family GGUF file (llama.cpp's format) as a Hugging Face
directory that dtrain (`model.init_from: OUT_DIR`) and transformers read:

    OUT_DIR/model.safetensors       every tensor dequantized to float32, under Hugging Face's names
    OUT_DIR/config.json             a LlamaForCausalLM config, from the GGUF's llama.* metadata
    OUT_DIR/tokenizer.json          a `tokenizers` file rebuilt from tokenizer.ggml.*
    OUT_DIR/tokenizer_config.json   special tokens, model_max_length and the chat template

Needs only the `gguf` (ggml-org's reader, which also dequantizes) and `numpy` packages; no torch.

Weights. llama.cpp's convert_hf_to_gguf.py stores q_proj and k_proj with their rows permuted
(`LlamaModel.permute`: within each head, the two rotate-half halves interleaved, the layout
ggml's RoPE wants); this undoes it exactly (n_head for q, n_head_kv for k), so the tensors are
transformers' again. Every tensor type the installed gguf package can dequantize is read
(F32, F16, BF16, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, the K-quants, ...); a quantized value becomes the
float32 value ggml itself computes from it, so a Q4_1 file gives a float32 model carrying the
Q4_1 rounding, not the original weights. Other types are refused by name.

Tokenizer. Only byte-level BPE vocabularies (tokenizer.ggml.model "gpt2") with a pre-tokenizer
whose Hugging Face counterpart is known are converted; any other `tokenizer.ggml.pre` is refused
rather than guessed, because a wrong pre-tokenizer still loads but splits text differently from
how the merges were learned. Known: "smollm", "starcoder" (llama.cpp splits \\p{N} then applies
GPT-2's regex: Hugging Face's Sequence[Digits(individual_digits), ByteLevel]) and "gpt-2"
(ByteLevel alone). Tokens llama.cpp marks CONTROL (or UNKNOWN) become special added tokens;
USER_DEFINED ones become non-special added tokens (matched whole, as llama.cpp does).
tokenizer_config.json names tokenizer_class PreTrainedTokenizerFast, not GPT2Tokenizer: transformers
5 rebuilds a GPT2Tokenizer's pipeline from the class (ByteLevel alone) and would drop the Digits
step, while PreTrainedTokenizerFast (TokenizersBackend) runs tokenizer.json as written.

Errors (not a GGUF, another architecture, a missing key, a shape that disagrees with the
metadata, an unknown tensor or tensor type) print `gguf-to-hf: error: FILE: ...` and exit 2.
"""
import json
import os
import struct
import sys
import time

PROG = "gguf-to-hf"

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as QT
except ImportError as e:
    sys.stderr.write("%s: error: needs the gguf and numpy packages (pip install gguf numpy): %s\n" % (PROG, e))
    sys.exit(2)


class BadInput(Exception):
    pass


def note(msg):
    sys.stderr.write("%s: %s\n" % (PROG, msg))
    sys.stderr.flush()


# --- GGUF metadata -------------------------------------------------------------------------------

def field_value(field):
    """The Python value of a GGUF key (str, int, float, bool or a list of those)."""
    if hasattr(field, "contents"):
        return field.contents()
    # gguf < 0.11 has no contents(): decode from parts/data ourselves
    t = field.types[0]
    if t == gguf.GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8")
    if t == gguf.GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == gguf.GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    return field.parts[field.data[0]].tolist()[0]


class Meta:
    def __init__(self, reader, path):
        self.fields = reader.fields
        self.path = path

    def has(self, key):
        return key in self.fields

    def get(self, key, default=None):
        return field_value(self.fields[key]) if key in self.fields else default

    def need(self, key):
        if key not in self.fields:
            raise BadInput("%s: the GGUF has no %s (needed for config.json)" % (self.path, key))
        return field_value(self.fields[key])


def f32(x):
    """A float32 metadata value as the shortest decimal that reads back as it (9.9999997e-06 -> 1e-05)."""
    return float(str(np.float32(x)))


# --- tensors -------------------------------------------------------------------------------------

LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(name, n_layer, path):
    if name in GLOBAL_NAMES:
        return GLOBAL_NAMES[name]
    parts = name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_NAMES \
            and parts[3] in ("weight", "bias"):
        i = int(parts[1])
        if i >= n_layer:
            raise BadInput("%s: tensor %s: layer %d, but llama.block_count is %d" % (path, name, i, n_layer))
        return "model.layers.%d.%s.%s" % (i, LAYER_NAMES[parts[2]], parts[3])
    raise BadInput("%s: tensor %s has no Hugging Face LlamaForCausalLM counterpart (rope_freqs, experts and "
                   "other extras are not supported)" % (path, name))


def undo_permute(w, n_head):
    """The inverse of llama.cpp's LlamaModel.permute (convert_hf_to_gguf.py):
         permute(w, n) = w.reshape(n, 2, rows // n // 2, *rest).swapaxes(1, 2).reshape(w.shape)
    i.e. row (h, half, j) of transformers' layout went to row (h, j, half); read it back."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ValueError("%d rows are not n_head=%d heads of an even size" % (rows, n_head))
    return np.ascontiguousarray(w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


def dequantize(t, path):
    """The tensor as float32, in numpy (= Hugging Face) dimension order."""
    qtype = QT(int(t.tensor_type))
    shape = tuple(int(d) for d in reversed([int(x) for x in t.shape]))  # ggml's ne is innermost-first
    if qtype == QT.F32:
        a = np.asarray(t.data).view(np.float32)
    elif qtype == QT.F16:
        a = np.asarray(t.data).view(np.float16).astype(np.float32)
    elif qtype == QT.F64:
        a = np.asarray(t.data).view(np.float64).astype(np.float32)
    else:
        quants = getattr(gguf, "quants", None)
        if quants is None or not hasattr(quants, "dequantize"):
            raise BadInput("%s: tensor %s is %s, and this gguf package (%s) cannot dequantize (install gguf>=0.10)"
                           % (path, t.name, qtype.name, getattr(gguf, "__version__", "?")))
        if qtype in (QT.I8, QT.I16, QT.I32, QT.I64):
            raise BadInput("%s: tensor %s is of integer type %s, not a weight" % (path, t.name, qtype.name))
        try:
            a = quants.dequantize(np.asarray(t.data), qtype)
        except NotImplementedError:
            raise BadInput("%s: tensor %s is %s, which the installed gguf package cannot dequantize"
                           % (path, t.name, qtype.name))
    a = np.asarray(a, dtype=np.float32)
    if a.size != int(np.prod(shape)):
        raise BadInput("%s: tensor %s: %d values for shape %s" % (path, t.name, a.size, list(shape)))
    return a.reshape(shape)


# --- tokenizer -----------------------------------------------------------------------------------

def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the alphabet of a byte-level vocabulary)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
# tokenizer.ggml.pre -> the pre_tokenizer Hugging Face ships with such a vocabulary. llama.cpp's
# llama-vocab.cpp gives "smollm" and "starcoder" the same two regexes, "\p{N}" then GPT-2's.
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
    "starcoder": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
    "gpt-2": BYTE_LEVEL,
}
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4


def added_token(i, content, special):
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def build_tokenizer(meta, vocab_size, path):
    model = meta.need("tokenizer.ggml.model")
    if model != "gpt2":
        raise BadInput("%s: tokenizer.ggml.model is %r; only byte-level BPE (\"gpt2\") is converted" % (path, model))
    pre = meta.get("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise BadInput("%s: tokenizer.ggml.pre is %r, a pre-tokenizer this converter does not know (known: %s); "
                       "refusing rather than guessing how text is split" % (path, pre, ", ".join(sorted(PRE_TOKENIZERS))))
    tokens = meta.need("tokenizer.ggml.tokens")
    merges = meta.need("tokenizer.ggml.merges")
    types = meta.get("tokenizer.ggml.token_type") or [TOKEN_NORMAL] * len(tokens)
    if len(types) != len(tokens):
        raise BadInput("%s: tokenizer.ggml.token_type has %d entries for %d tokens" % (path, len(types), len(tokens)))
    if len(tokens) > vocab_size:
        raise BadInput("%s: %d tokens, more than the embedding's %d rows" % (path, len(tokens), vocab_size))
    alphabet = set(bytes_to_unicode().values())
    vocab = {}
    added = []
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        if tok in vocab:
            raise BadInput("%s: token %d %r repeats token %d" % (path, i, tok, vocab[tok]))
        vocab[tok] = i
        if ty in (TOKEN_CONTROL, TOKEN_UNKNOWN):
            added.append(added_token(i, tok, True))
        elif ty == TOKEN_USER_DEFINED:
            added.append(added_token(i, tok, False))
        elif not set(tok) <= alphabet:
            raise BadInput("%s: token %d %r is marked normal but is not spelled in the byte-level alphabet"
                           % (path, i, tok))
    for k, m in enumerate(merges):
        ab = m.split(" ")
        if len(ab) != 2 or ab[0] not in vocab or ab[1] not in vocab or ab[0] + ab[1] not in vocab:
            raise BadInput("%s: tokenizer.ggml.merges[%d] %r is not two vocabulary tokens whose join is one"
                           % (path, k, m))
    post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", False))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    if add_bos or add_eos:
        specials, single, pair = [], [], []
        for flag, key in ((add_bos, "bos"), (add_eos, "eos")):
            if flag:
                tid = meta.get("tokenizer.ggml.%s_token_id" % key)
                if tid is None or not 0 <= tid < len(tokens):
                    raise BadInput("%s: tokenizer.ggml.add_%s_token is set but tokenizer.ggml.%s_token_id is "
                                   "missing or out of range" % (path, key, key))
                specials.append((key, tokens[tid], tid))
        bos = [s for s in specials if s[0] == "bos"]
        eos = [s for s in specials if s[0] == "eos"]
        for seq, tid_ in (("A", 0), ("B", 1)):
            part = [{"SpecialToken": {"id": b[1], "type_id": tid_}} for b in bos] + \
                   [{"Sequence": {"id": seq, "type_id": tid_}}] + \
                   [{"SpecialToken": {"id": e[1], "type_id": tid_}} for e in eos]
            if seq == "A":
                single = part
            pair += part
        post = {"type": "Sequence", "processors": [post, {
            "type": "TemplateProcessing", "single": single, "pair": pair,
            "special_tokens": {s[1]: {"id": s[1], "ids": [s[2]], "tokens": [s[1]]} for s in specials}}]}
    tok_json = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": post,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": list(merges)},
    }

    def token_of(key):
        tid = meta.get("tokenizer.ggml.%s_token_id" % key)
        if tid is None:
            return None
        if not 0 <= tid < len(tokens):
            raise BadInput("%s: tokenizer.ggml.%s_token_id %d is not a token id (%d tokens)" % (path, key, tid, len(tokens)))
        return tokens[tid]

    cfg = {
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "add_prefix_space": False,
        "added_tokens_decoder": {str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                                                  "single_word", "special")} for a in added},
        "bos_token": token_of("bos"),
        "clean_up_tokenization_spaces": False,
        "eos_token": token_of("eos"),
        "model_max_length": int(meta.need("llama.context_length")),
        "pad_token": token_of("padding"),
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": token_of("unknown"),
    }
    template = meta.get("tokenizer.chat_template")
    named = sorted(k for k in meta.fields if k.startswith("tokenizer.chat_template."))
    if named:
        cfg["chat_template"] = ([{"name": "default", "template": template}] if template is not None else []) + \
            [{"name": k[len("tokenizer.chat_template."):], "template": meta.get(k)} for k in named]
    elif template is not None:
        cfg["chat_template"] = template
    return tok_json, cfg, pre


# --- safetensors ---------------------------------------------------------------------------------

def safetensors_header(entries, metadata):
    """entries: [(name, shape)] of F32 tensors in file order -> (header bytes, [byte offsets])."""
    header = {"__metadata__": metadata}
    off = 0
    for name, shape in entries:
        n = 4 * int(np.prod(shape)) if shape else 4
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, off


# --- main ----------------------------------------------------------------------------------------

def convert(path, out):
    t0 = time.time()
    if not os.path.isfile(path):
        raise BadInput("%s: no such file" % path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise BadInput("%s: not a GGUF file (starts with %r, not b'GGUF')" % (path, magic))
    try:
        reader = gguf.GGUFReader(path, "r")
    except Exception as e:  # truncated or corrupt files fail in numpy's memmap/frombuffer
        raise BadInput("%s: cannot read it as GGUF: %s" % (path, e))
    if getattr(reader, "byte_order", "I") != "I":
        raise BadInput("%s: a big-endian GGUF; only little-endian files are supported" % path)
    meta = Meta(reader, path)
    arch = meta.need("general.architecture")
    if arch != "llama":
        raise BadInput("%s: general.architecture is %r; this converter reads the Llama family (\"llama\") only"
                       % (path, arch))
    if meta.has("llama.expert_count") and meta.get("llama.expert_count"):
        raise BadInput("%s: llama.expert_count is %d: mixture-of-experts models are not supported"
                       % (path, meta.get("llama.expert_count")))
    n_layer = int(meta.need("llama.block_count"))
    hidden = int(meta.need("llama.embedding_length"))
    inter = int(meta.need("llama.feed_forward_length"))
    n_head = int(meta.need("llama.attention.head_count"))
    n_kv = int(meta.get("llama.attention.head_count_kv", n_head))  # llama.cpp's default
    ctx = int(meta.need("llama.context_length"))
    eps = f32(meta.need("llama.attention.layer_norm_rms_epsilon"))
    theta = f32(meta.get("llama.rope.freq_base", 10000.0))  # llama.cpp's default
    if n_head <= 0 or n_kv <= 0 or n_head % n_kv:
        raise BadInput("%s: llama.attention.head_count %d is not a multiple of head_count_kv %d" % (path, n_head, n_kv))
    head_dim = int(meta.get("llama.attention.key_length", hidden // n_head))
    if meta.get("llama.attention.value_length", head_dim) != head_dim:
        raise BadInput("%s: llama.attention.value_length %d differs from key_length %d"
                       % (path, meta.get("llama.attention.value_length"), head_dim))
    if not meta.has("llama.attention.key_length") and hidden % n_head:
        raise BadInput("%s: embedding_length %d is not a multiple of head_count %d" % (path, hidden, n_head))
    rope_dim = int(meta.get("llama.rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise BadInput("%s: llama.rope.dimension_count %d is not the head size %d (partial rotary is not Llama's)"
                       % (path, rope_dim, head_dim))
    rope_scaling = None
    stype = meta.get("llama.rope.scaling.type")
    if stype not in (None, "none"):
        if stype == "linear":
            rope_scaling = {"rope_type": "linear", "factor": f32(meta.need("llama.rope.scaling.factor"))}
        else:
            raise BadInput("%s: llama.rope.scaling.type %r is not supported (only none and linear)" % (path, stype))
    elif meta.has("llama.rope.scaling.factor") and meta.get("llama.rope.scaling.factor") not in (0.0, 1.0):
        raise BadInput("%s: llama.rope.scaling.factor without llama.rope.scaling.type" % path)

    # tensors: names, shapes, what each must be
    by_name = {}
    for t in reader.tensors:
        by_name[hf_name(t.name, n_layer, path)] = t
    if "model.embed_tokens.weight" not in by_name:
        raise BadInput("%s: no token_embd.weight tensor" % path)
    vocab = int(meta.get("llama.vocab_size", int(by_name["model.embed_tokens.weight"].shape[1])))
    tied = "lm_head.weight" not in by_name
    q_rows, kv_rows = n_head * head_dim, n_kv * head_dim
    want = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    if not tied:
        want["lm_head.weight"] = (vocab, hidden)
    for i in range(n_layer):
        p = "model.layers.%d." % i
        want.update({p + "self_attn.q_proj.weight": (q_rows, hidden), p + "self_attn.k_proj.weight": (kv_rows, hidden),
                     p + "self_attn.v_proj.weight": (kv_rows, hidden), p + "self_attn.o_proj.weight": (hidden, q_rows),
                     p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
                     p + "mlp.down_proj.weight": (hidden, inter), p + "input_layernorm.weight": (hidden,),
                     p + "post_attention_layernorm.weight": (hidden,)})
    attn_bias = any(n.endswith(("_proj.bias",)) and ".self_attn." in n for n in by_name)
    mlp_bias = any(n.endswith(".bias") and ".mlp." in n for n in by_name)
    for i in range(n_layer):
        p = "model.layers.%d." % i
        if attn_bias:
            want.update({p + "self_attn.q_proj.bias": (q_rows,), p + "self_attn.k_proj.bias": (kv_rows,),
                         p + "self_attn.v_proj.bias": (kv_rows,), p + "self_attn.o_proj.bias": (hidden,)})
        if mlp_bias:
            want.update({p + "mlp.gate_proj.bias": (inter,), p + "mlp.up_proj.bias": (inter,),
                         p + "mlp.down_proj.bias": (hidden,)})
    gguf_of = {v: k for k, v in GLOBAL_NAMES.items()}
    for name, shape in want.items():
        if name not in by_name:
            raise BadInput("%s: tensor %s (%s) is missing" % (path, gguf_name(name, gguf_of), name))
        got = tuple(int(d) for d in reversed([int(x) for x in by_name[name].shape]))
        if got != shape:
            raise BadInput("%s: tensor %s has shape %s (numpy order), the metadata says %s"
                           % (path, by_name[name].name, list(got), list(shape)))
    for name in by_name:
        if name not in want:
            raise BadInput("%s: unexpected tensor %s" % (path, by_name[name].name))

    from collections import Counter
    kinds = Counter(QT(int(t.tensor_type)).name for t in reader.tensors)
    note("%s: llama, %d layers, hidden %d, %d/%d heads of %d, intermediate %d, vocabulary %d, %s; %d tensors (%s)"
         % (os.path.basename(path), n_layer, hidden, n_head, n_kv, head_dim, inter, vocab,
            "tied embeddings" if tied else "separate lm_head", len(by_name),
            ", ".join("%d %s" % (n, k) for k, n in sorted(kinds.items()))))

    tok_json, tok_cfg, pre = build_tokenizer(meta, vocab, path)

    def tid(key):
        v = meta.get("tokenizer.ggml.%s_token_id" % key)
        return int(v) if v is not None else None

    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "attention_bias": attn_bias,
        "attention_dropout": 0.0,
        "bos_token_id": tid("bos"),
        "eos_token_id": tid("eos"),
        "pad_token_id": tid("padding"),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "max_position_embeddings": ctx,
        "mlp_bias": mlp_bias,
        "num_attention_heads": n_head,
        "num_hidden_layers": n_layer,
        "num_key_value_heads": n_kv,
        "pretraining_tp": 1,
        "rms_norm_eps": eps,
        "rope_scaling": rope_scaling,
        "rope_theta": theta,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
        "dtype": "float32",
        "use_cache": True,
        "vocab_size": vocab,
    }

    os.makedirs(out, exist_ok=True)
    order = sorted(want)
    src_meta = {"format": "pt", "source": "gguf-to-hf.py " + os.path.basename(path)}
    header, total = safetensors_header([(n, want[n]) for n in order], src_meta)
    note("dequantizing %d tensors to float32 (%.0f MB) into %s" % (len(order), total / 1e6,
                                                                    os.path.join(out, "model.safetensors")))
    tmp = os.path.join(out, "model.safetensors.tmp")
    with open(tmp, "wb") as f:
        f.write(header)
        last = time.time()
        for k, name in enumerate(order):
            t = by_name[name]
            a = dequantize(t, path)
            if ".q_proj." in name:
                a = undo_permute(a, n_head)
            elif ".k_proj." in name:
                a = undo_permute(a, n_kv)
            if not np.all(np.isfinite(a)):
                raise BadInput("%s: tensor %s holds NaN or infinite values" % (path, t.name))
            f.write(np.ascontiguousarray(a, dtype="<f4").tobytes())
            if time.time() - last > 2 or k + 1 == len(order):
                note("  %d/%d tensors (%.1f s)" % (k + 1, len(order), time.time() - t0))
                last = time.time()
    os.replace(tmp, os.path.join(out, "model.safetensors"))
    for fname, obj in (("config.json", config), ("tokenizer.json", tok_json), ("tokenizer_config.json", tok_cfg)):
        with open(os.path.join(out, fname), "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=2 if fname != "tokenizer.json" else None, ensure_ascii=False)
            f.write("\n")
    note("wrote %s: model.safetensors, config.json, tokenizer.json (%d tokens, %d merges, pre-tokenizer %s), "
         "tokenizer_config.json%s in %.1f s" % (out, len(tok_json["model"]["vocab"]), len(tok_json["model"]["merges"]),
                                                pre, " (with the chat template)" if "chat_template" in tok_cfg else "",
                                                time.time() - t0))


def gguf_name(hf, gguf_of):
    if hf in gguf_of:
        return gguf_of[hf]
    inv = {v: k for k, v in LAYER_NAMES.items()}
    p = hf.split(".")  # model.layers.N.a.b.weight
    return "blk.%s.%s.%s" % (p[2], inv.get(p[3] + "." + p[4], "?"), p[5])


def main(argv):
    if len(argv) == 2 and argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    if len(argv) != 3:
        sys.stderr.write("usage: gguf-to-hf.py GGUF OUT_DIR (--help for more)\n")
        return 2
    try:
        convert(argv[1], argv[2])
    except BadInput as e:
        sys.stderr.write("%s: error: %s\n" % (PROG, e))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
