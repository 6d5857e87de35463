/* gpt2.c — GPT-2 as data (net.h; DESIGN.md §4): learned positions, LayerNorm (eps 1e-5), a
 * 4C-wide GELU (tanh) MLP, full multi-head attention with one packed [q | k | v] product,
 * biases everywhere, the output head tied to the token embedding. Its tensors carry Hugging
 * Face's GPT-2 names and Conv1D layouts ([in, out]); on disk they may carry "transformer.". */
#include "net.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* Parameter order, one bucket each: "embed" wte, wpe; "h.l" ln_1, attn.c_attn, attn.c_proj,
 * ln_2, mlp.c_fc, mlp.c_proj (weight, then bias); "head" ln_f, [score]. Init: normal(0, 0.02),
 * the residual projections (attn.c_proj, mlp.c_proj) 0.02/sqrt(2L), biases 0, LayerNorm
 * weights 1; decay on the matrices only. */
static void gpt2_layout(net_builder *b, net_weights *w) {
    const dt_model_shape *s = &b->cfg->shape;
    const int C = s->n_embd, L = s->n_layer;
    const double resid = 0.02 / sqrt(2.0 * L);
    char nm[64];
    /* one call a statement: the order of the calls in an initializer list is unspecified */
#define VEC(field, init, len) (snprintf(nm, sizeof nm, "h.%d.%s", l, field), dt_net_add(b, nm, len, 0, init, 0, 0, 1 + l))
#define MAT(field, rows, cols, std) \
    (snprintf(nm, sizeof nm, "h.%d.%s", l, field), dt_net_add(b, nm, rows, cols, NET_INIT_NORMAL, std, 1, 1 + l))
    /* tensor parallelism: c_attn's [q | k | v] and c_fc's columns split (and their biases), c_proj's rows */
#define SPLIT_VEC(field, len, sections) \
    (snprintf(nm, sizeof nm, "h.%d.%s", l, field), \
     dt_net_add_split(b, nm, len, 0, NET_INIT_ZERO, 0, 0, 1 + l, DT_SPLIT_ROWS, sections))
#define SPLIT_MAT(field, rows, cols, std, split, sections) \
    (snprintf(nm, sizeof nm, "h.%d.%s", l, field), \
     dt_net_add_split(b, nm, rows, cols, NET_INIT_NORMAL, std, 1, 1 + l, split, sections))
    const int tp = b->tp > 1 ? b->tp : 1;
    /* tensor parallelism: each share holds its rows of the vocabulary (the embedding and the tied head) */
    w->wte = dt_net_add_split(b, "wte.weight", s->vocab_size, C, NET_INIT_NORMAL, 0.02, 1, 0, DT_SPLIT_ROWS, 1);
    w->wpe = dt_net_add(b, "wpe.weight", s->n_positions, C, NET_INIT_NORMAL, 0.02, 1, 0);
    for (int l = 0; l < L; l++) {
        net_layer *y = &w->layers[l];
        y->attn_norm.w = VEC("ln_1.weight", NET_INIT_ONE, C);
        y->attn_norm.b = VEC("ln_1.bias", NET_INIT_ZERO, C);
        y->qkv = (net_linear){.in = C, .out = 3 * C / tp, .trans = 0, .tp = NET_TP_COLS};
        y->qkv.w = SPLIT_MAT("attn.c_attn.weight", C, 3 * C, 0.02, DT_SPLIT_COLS, 3);
        y->qkv.b = SPLIT_VEC("attn.c_attn.bias", 3 * C, 3);
        y->attn_out = (net_linear){.in = C / tp, .out = C, .trans = 0, .tp = NET_TP_ROWS};
        y->attn_out.w = SPLIT_MAT("attn.c_proj.weight", C, C, resid, DT_SPLIT_ROWS, 1);
        y->attn_out.b = VEC("attn.c_proj.bias", NET_INIT_ZERO, C);
        y->mlp_norm.w = VEC("ln_2.weight", NET_INIT_ONE, C);
        y->mlp_norm.b = VEC("ln_2.bias", NET_INIT_ZERO, C);
        y->mlp_in = (net_linear){.in = C, .out = 4 * C / tp, .trans = 0, .tp = NET_TP_COLS};
        y->mlp_in.w = SPLIT_MAT("mlp.c_fc.weight", C, 4 * C, 0.02, DT_SPLIT_COLS, 1);
        y->mlp_in.b = SPLIT_VEC("mlp.c_fc.bias", 4 * C, 1);
        y->mlp_out = (net_linear){.in = 4 * C / tp, .out = C, .trans = 0, .tp = NET_TP_ROWS};
        y->mlp_out.w = SPLIT_MAT("mlp.c_proj.weight", 4 * C, C, resid, DT_SPLIT_ROWS, 1);
        y->mlp_out.b = VEC("mlp.c_proj.bias", NET_INIT_ZERO, C);
    }
#undef SPLIT_VEC
#undef SPLIT_MAT
#undef VEC
#undef MAT
    w->final_norm.w = dt_net_add(b, "ln_f.weight", C, 0, NET_INIT_ONE, 0, 0, L + 1);
    w->final_norm.b = dt_net_add(b, "ln_f.bias", C, 0, NET_INIT_ZERO, 0, 0, L + 1);
    w->tied = 1;
    w->head = (net_linear){.w = w->wte, .b = NET_NONE, .in = C, .out = net_part_len(s->vocab_size, tp, b->tp_rank),
                           .trans = 1, .tp = NET_TP_COLS};
    if (s->num_labels) {
        w->head = (net_linear){.b = NET_NONE, .in = C, .out = s->num_labels, .trans = 1};
        w->head.w = dt_net_add(b, "score.weight", s->num_labels, C, NET_INIT_NORMAL, 0.02, 1, L + 1);
    }
}

/* LoRA's targets (arch.h): c_attn, attn.c_proj, c_fc, mlp.c_proj, each a whole product */
static void gpt2_lora_site(const dt_model_shape *s, int t, net_layer *y, net_linear **lin, int *col0, int *cols,
                           int *sections) {
    const char *name = dt_lora_target_name(t);
    const int C = s->n_embd, attn = strcmp(name, "c_attn") == 0, fc = strcmp(name, "c_fc") == 0;
    *lin = attn                               ? &y->qkv
           : strcmp(name, "attn.c_proj") == 0 ? &y->attn_out
           : fc                               ? &y->mlp_in
                                              : &y->mlp_out;
    *col0 = 0;
    *cols = attn ? 3 * C : fc ? 4 * C : C;
    *sections = attn ? 3 : 1;
}

static const char *const gpt2_ignored[] = {".attn.bias", ".attn.masked_bias", ""};

const net_arch dt_net_gpt2 = {
    .id = DT_ARCH_GPT2,
    .norm = NET_LAYERNORM,
    .mlp = NET_GELU,
    .rope = 0,
    .layout = gpt2_layout,
    .hf_prefix = "transformer.",
    .ignored_suffixes = gpt2_ignored,
    .head_name = "lm_head.weight",
    .embed_name = "wte.weight",
    .positions_name = "wpe.weight",
    .layer_prefix = "h.",
    .lora_site = gpt2_lora_site,
};
