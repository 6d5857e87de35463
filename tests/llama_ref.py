"""llama_ref.py — the Llama family's forward in numpy (float64), as transformers' LlamaForCausalLM
and LlamaForSequenceClassification compute it, written independently of dtrain: the reference
tests/test_llama.py holds dtrain to. Written with autograd.numpy when that is importable (so that
autograd differentiates it for the training-step reference), plain numpy otherwise.

Weights are a dict of Hugging Face names -> arrays ([out, in] Linear layouts); cfg a dict of
config.json's keys."""
try:
    import autograd.numpy as np
except ImportError:  # the forward alone
    import numpy as np
import numpy as onp


def inv_freq(cfg):
    """RoPE's frequencies as transformers computes them, in float32: the default rope type, or
    rope_scaling's "llama3" (Llama 3.1: long wavelengths divided by factor, short ones kept, the
    ones between interpolated), written from Meta's description of it"""
    hs = head_dim(cfg)
    e = onp.arange(0, hs, 2, dtype=onp.int64).astype(onp.float32) / onp.float32(hs)
    f = (onp.float32(1.0) / (onp.float32(cfg.get("rope_theta", 10000.0)) ** e)).astype(onp.float32)
    rs = cfg.get("rope_scaling") or {}
    if rs.get("rope_type", rs.get("type", "default")) != "llama3":
        return f
    f32 = onp.float32
    factor, lo, hi = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    orig = rs["original_max_position_embeddings"]
    out = []
    for inv in f:
        wavelen = f32(f32(1.0) / inv) * f32(2 * onp.pi)
        if wavelen > f32(orig / lo):
            out.append(inv / f32(factor))
        elif wavelen < f32(orig / hi):
            out.append(inv)
        else:
            smooth = (f32(f32(1.0) / wavelen) * f32(orig) - f32(lo)) / f32(hi - lo)
            out.append(f32((f32(1.0) - smooth) * inv) / f32(factor) + f32(smooth * inv))
    return onp.array(out, dtype=onp.float32)


def head_dim(cfg):
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def rope_tables(cfg, T):
    """cos and sin (T, hs): transformers' emb = cat(freqs, freqs), freqs = pos * inv_freq in float32"""
    f = inv_freq(cfg)
    freqs = (onp.arange(T, dtype=onp.float32)[:, None] * f[None, :]).astype(onp.float32)
    emb = onp.concatenate([freqs, freqs], axis=-1)
    return onp.cos(emb).astype(onp.float64), onp.sin(emb).astype(onp.float64)


def rms_norm(x, w, eps):
    return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))


def rotate(x, cos, sin):
    """x (B, H, T, hs): x cos + rotate_half(x) sin"""
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin


def linear(W, name, x):
    y = np.dot(x, W[name + ".weight"].T)
    if name + ".bias" in W:
        y = y + W[name + ".bias"]
    return y


def hidden(W, cfg, ids):
    """the last norm's output (B, T, C) for token ids (B, T)"""
    B, T = ids.shape
    NH, C = cfg["num_attention_heads"], cfg["hidden_size"]
    NKV = cfg.get("num_key_value_heads") or NH
    hs, eps = head_dim(cfg), cfg.get("rms_norm_eps", 1e-6)
    cos, sin = rope_tables(cfg, T)
    mask = onp.triu(onp.full((T, T), -1e30), 1)
    x = W["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        h = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = linear(W, p + "self_attn.q_proj", h).reshape(B, T, NH, hs).transpose((0, 2, 1, 3))
        k = linear(W, p + "self_attn.k_proj", h).reshape(B, T, NKV, hs).transpose((0, 2, 1, 3))
        v = linear(W, p + "self_attn.v_proj", h).reshape(B, T, NKV, hs).transpose((0, 2, 1, 3))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        g = NH // NKV  # repeat_kv: query head i reads key/value head i // g
        k = np.concatenate([k[:, i // g:i // g + 1] for i in range(NH)], axis=1)
        v = np.concatenate([v[:, i // g:i // g + 1] for i in range(NH)], axis=1)
        s = np.einsum("bhtd,bhsd->bhts", q, k) / onp.sqrt(hs) + mask
        s = s - np.max(s, axis=-1, keepdims=True)
        a = np.exp(s)
        a = a / np.sum(a, axis=-1, keepdims=True)
        y = np.einsum("bhts,bhsd->bhtd", a, v).transpose((0, 2, 1, 3)).reshape(B, T, NH * hs)
        x = x + linear(W, p + "self_attn.o_proj", y)
        h = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        gate = linear(W, p + "mlp.gate_proj", h)
        x = x + linear(W, p + "mlp.down_proj", gate / (1.0 + np.exp(-gate)) * linear(W, p + "mlp.up_proj", h))
    return rms_norm(x, W["model.norm.weight"], eps)


def logits(W, cfg, ids):
    """(B, T, V) of a causal LM: the head is lm_head, or the embedding when tied"""
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else W["lm_head.weight"]
    return np.dot(hidden(W, cfg, ids), head.T)


def log_softmax(z):
    z = z - np.max(z, axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def lm_losses(W, cfg, ids, targets):
    """each position's cross-entropy (B, T) for targets (B, T) (-1: ignored, 0 loss)"""
    lp = log_softmax(logits(W, cfg, ids))
    t = onp.where(targets < 0, 0, targets)
    picked = np.sum(lp * onp.eye(lp.shape[-1])[t], axis=-1)
    return -picked * (targets >= 0)


def mean_lm_loss(W, cfg, ids, targets):
    return np.sum(lm_losses(W, cfg, ids, targets)) / onp.sum(targets >= 0)


def write_shard(path, tokens):
    """tokens as a token shard (llm.c's format, DESIGN.md §5: 256 int32 of header, uint16 ids)"""
    with open(path, "wb") as f:
        hdr = onp.zeros(256, dtype=onp.int32)
        hdr[0], hdr[1], hdr[2] = 20240520, 1, len(tokens)
        f.write(hdr.tobytes())
        f.write(onp.asarray(tokens).astype(onp.uint16).tobytes())


def adamw_steps(P, grad, batches, lr, betas, eps, wd, clip):
    """torch.optim.AdamW over the dict of arrays P (float64 copies; decay on >= 2-D ones) after
    torch.nn.utils.clip_grad_norm_(clip), one step per (ids, targets) of batches; grad(flat list
    in sorted-name order, ids, targets) gives the gradients in that order. Returns the new P."""
    names = sorted(P)
    P = {k: onp.asarray(v, dtype=onp.float64) for k, v in P.items()}
    m = {k: onp.zeros_like(v) for k, v in P.items()}
    v2 = {k: onp.zeros_like(v) for k, v in P.items()}
    for step, (ids, tgt) in enumerate(batches):
        g = dict(zip(names, grad([P[k] for k in names], ids, tgt)))
        norm = onp.sqrt(sum(float(onp.sum(x * x)) for x in g.values()))
        c = min(1.0, clip / (norm + 1e-6))
        t = step + 1
        for k in names:
            gk = g[k] * c
            if P[k].ndim >= 2:
                P[k] = P[k] * (1 - lr * wd)
            m[k] = betas[0] * m[k] + (1 - betas[0]) * gk
            v2[k] = betas[1] * v2[k] + (1 - betas[1]) * gk * gk
            P[k] = P[k] - lr / (1 - betas[0] ** t) * m[k] / (onp.sqrt(v2[k]) / onp.sqrt(1 - betas[1] ** t) + eps)
    return P


# a small Llama-family config.json: grouped-query attention (4 query heads on 2 key/value
# heads), a head size that is not hidden_size / num_attention_heads, an untied head
CFG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 257, "hidden_size": 24,
    "intermediate_size": 40, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "max_position_embeddings": 64, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False, "hidden_act": "silu",
    "rope_scaling": None, "bos_token_id": None, "eos_token_id": None,
}


def random_weights(cfg, seed):
    """a model of config cfg: matrices normal(0, 0.15), norms 1 + normal(0, 0.1), float32"""
    rng = onp.random.default_rng(seed)
    C, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    NH, NKV, hs = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]

    def mat(*shape):
        return (rng.standard_normal(shape) * 0.15).astype(onp.float32)

    W = {"model.embed_tokens.weight": mat(V, C), "model.norm.weight": (1 + 0.1 * rng.standard_normal(C)).astype(onp.float32)}
    if not cfg["tie_word_embeddings"]:
        W["lm_head.weight"] = mat(V, C)
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        W[p + "input_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(C)).astype(onp.float32)
        W[p + "post_attention_layernorm.weight"] = (1 + 0.1 * rng.standard_normal(C)).astype(onp.float32)
        W[p + "self_attn.q_proj.weight"] = mat(NH * hs, C)
        W[p + "self_attn.k_proj.weight"] = mat(NKV * hs, C)
        W[p + "self_attn.v_proj.weight"] = mat(NKV * hs, C)
        W[p + "self_attn.o_proj.weight"] = mat(C, NH * hs)
        W[p + "mlp.gate_proj.weight"] = mat(I, C)
        W[p + "mlp.up_proj.weight"] = mat(I, C)
        W[p + "mlp.down_proj.weight"] = mat(C, I)
    return W


def write_dir(path, cfg, W):
    """a Hugging Face directory: config.json and model.safetensors"""
    import json
    import os
    from safetensors.numpy import save_file
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    save_file(W, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
