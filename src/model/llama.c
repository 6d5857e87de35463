/* llama.c — the Llama family as data (net.h; DESIGN.md §4), the computation of transformers'
 * LlamaForCausalLM and LlamaForSequenceClassification: no learned positions (RoPE, rotate-half,
 * on q and k), RMSNorm (model.rms_norm_eps), a SwiGLU MLP (model.intermediate_size),
 * grouped-query attention (model.num_key_value_heads, model.head_dim), projections without
 * biases (but q, k, v, o with model.attention_bias; q, k, v with model.qkv_bias, as Qwen 2),
 * RoPE's frequencies as transformers' default or "llama3" rope types, the output head tied to the embedding or
 * its own (model.tie_word_embeddings). Tensors carry Hugging Face's names and nn.Linear layouts
 * ([out, in]). */
#include "net.h"

#include <stdio.h>
#include <string.h>

/* Parameter order, one bucket each: "embed" model.embed_tokens; "h.l" input_layernorm,
 * q_proj, k_proj, v_proj (contiguous: one product gives the packed [q | k | v] row) and their
 * biases, o_proj, post_attention_layernorm, gate_proj, up_proj (contiguous: one product gives
 * [gate | up]), down_proj; "head" model.norm, [lm_head], [score]. Init: normal(0, 0.02), norms
 * 1, biases 0; decay on the matrices only. */
static void llama_layout(net_builder *b, net_weights *w) {
    const dt_model_shape *s = &b->cfg->shape;
    const int C = s->n_embd, L = s->n_layer, NH = s->n_head, NKV = dt_shape_kv_heads(s), hs = dt_shape_head_dim(s);
    const int I = s->intermediate_size, QKV = (NH + 2 * NKV) * hs;
    char nm[96];
    /* one call a statement: the order of the calls in an initializer list is unspecified */
#define VEC(field, init, len) \
    (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, field), dt_net_add(b, nm, len, 0, init, 0, 0, 1 + l))
    /* tensor parallelism: q, k, v, gate and up split by rows (whole heads; k and v by key/value
     * heads), o and down by columns; each share's q, k, v (gate, up) lie together as one product */
#define SPLIT_VEC(field, len) \
    (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, field), \
     dt_net_add_split(b, nm, len, 0, NET_INIT_ZERO, 0, 0, 1 + l, DT_SPLIT_ROWS, 1))
#define MAT(field, rows, cols, split) \
    (snprintf(nm, sizeof nm, "model.layers.%d.%s", l, field), \
     dt_net_add_split(b, nm, rows, cols, NET_INIT_NORMAL, 0.02, 1, 1 + l, split, 1))
    const int tp = b->tp > 1 ? b->tp : 1;
    /* tensor parallelism: each share holds its rows of the vocabulary (the embedding and the head) */
    w->wte = dt_net_add_split(b, "model.embed_tokens.weight", s->vocab_size, C, NET_INIT_NORMAL, 0.02, 1, 0,
                              DT_SPLIT_ROWS, 1);
    w->wpe = NET_NONE;
    for (int l = 0; l < L; l++) {
        net_layer *y = &w->layers[l];
        y->attn_norm = (net_norm){VEC("input_layernorm.weight", NET_INIT_ONE, C), NET_NONE};
        y->qkv = (net_linear){.b = NET_NONE, .in = C, .out = QKV / tp, .trans = 1, .tp = NET_TP_COLS};
        y->qkv.w = MAT("self_attn.q_proj.weight", NH * hs, C, DT_SPLIT_ROWS);
        MAT("self_attn.k_proj.weight", NKV * hs, C, DT_SPLIT_ROWS);
        MAT("self_attn.v_proj.weight", NKV * hs, C, DT_SPLIT_ROWS);
        y->attn_out = (net_linear){.b = NET_NONE, .in = NH * hs / tp, .out = C, .trans = 1, .tp = NET_TP_ROWS};
        if (s->attention_bias || s->qkv_bias) {
            y->qkv.b = SPLIT_VEC("self_attn.q_proj.bias", NH * hs);
            SPLIT_VEC("self_attn.k_proj.bias", NKV * hs);
            SPLIT_VEC("self_attn.v_proj.bias", NKV * hs);
        }
        y->attn_out.w = MAT("self_attn.o_proj.weight", C, NH * hs, DT_SPLIT_COLS);
        if (s->attention_bias) y->attn_out.b = VEC("self_attn.o_proj.bias", NET_INIT_ZERO, C);
        y->mlp_norm = (net_norm){VEC("post_attention_layernorm.weight", NET_INIT_ONE, C), NET_NONE};
        y->mlp_in = (net_linear){.b = NET_NONE, .in = C, .out = 2 * I / tp, .trans = 1, .tp = NET_TP_COLS};
        y->mlp_in.w = MAT("mlp.gate_proj.weight", I, C, DT_SPLIT_ROWS);
        MAT("mlp.up_proj.weight", I, C, DT_SPLIT_ROWS);
        y->mlp_out = (net_linear){.b = NET_NONE, .in = I / tp, .out = C, .trans = 1, .tp = NET_TP_ROWS};
        y->mlp_out.w = MAT("mlp.down_proj.weight", C, I, DT_SPLIT_COLS);
    }
#undef SPLIT_VEC
#undef VEC
#undef MAT
    w->final_norm = (net_norm){dt_net_add(b, "model.norm.weight", C, 0, NET_INIT_ONE, 0, 0, L + 1), NET_NONE};
    w->tied = s->tie_word_embeddings;
    const int V = net_part_len(s->vocab_size, tp, b->tp_rank);
    w->head = (net_linear){.w = w->wte, .b = NET_NONE, .in = C, .out = V, .trans = 1, .tp = NET_TP_COLS};
    if (s->num_labels) {
        w->head = (net_linear){.b = NET_NONE, .in = C, .out = s->num_labels, .trans = 1};
        w->head.w = dt_net_add(b, "score.weight", s->num_labels, C, NET_INIT_NORMAL, 0.02, 1, L + 1);
    } else if (!w->tied) {
        w->head.w = dt_net_add_split(b, "lm_head.weight", s->vocab_size, C, NET_INIT_NORMAL, 0.02, 1, L + 1,
                                     DT_SPLIT_ROWS, 1);
    }
}

/* LoRA's targets (arch.h): q, k, v (columns of the stacked [q | k | v] product), o, gate, up
 * (of [gate | up]), down */
static void llama_lora_site(const dt_model_shape *s, int t, net_layer *y, net_linear **lin, int *col0, int *cols,
                            int *sections) {
    const int NH = s->n_head, NKV = dt_shape_kv_heads(s), hs = dt_shape_head_dim(s), I = s->intermediate_size;
    *sections = 1;
    static const char *const names[] = {"q", "k", "v", "o", "gate", "up", "down"};
    int k = 0;
    while (k < 6 && strcmp(names[k], dt_lora_target_name(t)) != 0) k++;
    switch (k) {
    case 0: *lin = &y->qkv, *col0 = 0, *cols = NH * hs; break;
    case 1: *lin = &y->qkv, *col0 = NH * hs, *cols = NKV * hs; break;
    case 2: *lin = &y->qkv, *col0 = (NH + NKV) * hs, *cols = NKV * hs; break;
    case 3: *lin = &y->attn_out, *col0 = 0, *cols = s->n_embd; break;
    case 4: *lin = &y->mlp_in, *col0 = 0, *cols = I; break;
    case 5: *lin = &y->mlp_in, *col0 = I, *cols = I; break;
    default: *lin = &y->mlp_out, *col0 = 0, *cols = s->n_embd; break;
    }
}

static const char *const llama_ignored[] = {".rotary_emb.inv_freq", ""};

const net_arch dt_net_llama = {
    .id = DT_ARCH_LLAMA,
    .norm = NET_RMSNORM,
    .mlp = NET_SWIGLU,
    .rope = 1,
    .layout = llama_layout,
    .hf_prefix = "",
    .ignored_suffixes = llama_ignored,
    .head_name = "lm_head.weight",
    .embed_name = "model.embed_tokens.weight",
    .positions_name = NULL,
    .layer_prefix = "model.layers.",
    .lora_site = llama_lora_site,
};
