/* model.c — GPT-2 forward/backward over the op table, parameter layout and weights I/O.
 *
 * This file never calls BLAS or CUDA: every numeric step goes through dt_ops, with
 * pointers the backend allocated. Host memory is used only for inputs (tokens, targets)
 * before upload and for the weights file round trip. */
#include "dtrain/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/safetensors.h"

/* Per-layer parameter tensors, in layout order. */
enum {
    P_LN1W, P_LN1B, P_QKVW, P_QKVB, P_ATTPROJW, P_ATTPROJB,
    P_LN2W, P_LN2B, P_FCW, P_FCB, P_FCPROJW, P_FCPROJB, P_PER_LAYER
};

static const char *const layer_tensor_names[P_PER_LAYER] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
    "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias",
    "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
};

/* Saved activations of one layer (backend memory, in the activation arena). */
typedef struct layer_acts {
    dt_act *ln1;       /* (B,T,C) */
    float *ln1_mean;   /* (B,T) */
    float *ln1_rstd;   /* (B,T) */
    dt_act *qkv;       /* (B,T,3C) */
    dt_act *atty;      /* (B,T,C) attention output before c_proj */
    void *att;         /* what attention keeps for backward (ops attention_bytes) */
    dt_act *res2;      /* (B,T,C) residual after attention */
    dt_act *ln2;       /* (B,T,C) */
    float *ln2_mean;   /* (B,T) */
    float *ln2_rstd;   /* (B,T) */
    dt_act *fch;       /* (B,T,4C) c_fc output */
    dt_act *fch_gelu;  /* (B,T,4C) */
    dt_act *res3;      /* (B,T,C) residual after the MLP = layer output */
} layer_acts;

struct dt_model {
    dt_model_cfg cfg;
    const dt_backend *be;
    dt_dtype act_dtype;        /* the backend's activation element */

    int n_tensors;
    dt_tensor_info *tensors;   /* (n_tensors) host */
    int n_buckets;
    dt_bucket *buckets;        /* (n_buckets) host */
    char (*bucket_names)[16];
    size_t n_params;
    float *params;             /* backend (n_params) */
    float *grads;              /* backend (n_params) */

    /* activations for max_batch: pointers into one arena (act_table) */
    void *arena;
    dt_act *encoded;           /* (B,T,C) residual stream input of layer 0 */
    layer_acts *layers;        /* (L) */
    dt_act *lnf;               /* LM: (B,T,C); cls: (B,C) */
    float *lnf_mean, *lnf_rstd;/* LM: (B,T); cls: (B) */
    dt_act *pooled_in;         /* cls: (B,C) residual rows at the pooled positions */
    dt_act *logits;            /* LM: (B,T,V); cls: (B,num_labels); probs/dlogits in place; rows
                                  logits_ld apart */
    int logits_ld;             /* the backend's row stride for them (ops logits_stride) */
    float *losses;             /* (B*T) */
    int *tokens_dev;           /* (B,T) */
    int *targets_dev;          /* LM (B,T), cls (B) */
    int *rows_dev;             /* cls: (B) pooled row indices b*T + pos */
    int *argmax_dev;           /* (B*T) LM, (B) cls: predicted class of each row */

    /* backward scratch */
    dt_act *dresidual;         /* (B,T,C) */
    dt_act *dln;               /* (B,T,C) also used for datty */
    dt_act *dqkv;              /* (B,T,3C) */
    void *datt;                /* attention backward's scratch (ops attention_bytes) */
    dt_act *dfch, *dfch_gelu;  /* (B,T,4C) */
    dt_act *dpooled;           /* cls: (B,C) */

    /* host staging */
    float *host_losses;        /* (B*T) */
    int *host_argmax;          /* (B*T) */
    int *host_rows;            /* (B) */
    void *host_probs;          /* cls: (B,logits_ld) the activation element, as downloaded */
    float *host_probs_f;       /* cls: (B,num_labels) as floats */

    int last_B;                /* batch of the last forward, 0 = none */
    int logits_are_grads;      /* the last forward left the logits' gradient there (ops xent_fused) */
    float fused_scale;         /* ... for this scale */
};

/* ---- layout ---- */

static size_t layer_numel(int i, size_t C) {
    switch (i) {
    case P_QKVW: return C * 3 * C;
    case P_QKVB: return 3 * C;
    case P_ATTPROJW: return C * C;
    case P_FCW: case P_FCPROJW: return C * 4 * C;
    case P_FCB: return 4 * C;
    default: return C;
    }
}

static void layer_shape(int i, int C, int *ndim, int shape[2]) {
    *ndim = 2;
    switch (i) {
    case P_QKVW: shape[0] = C; shape[1] = 3 * C; return;
    case P_ATTPROJW: shape[0] = C; shape[1] = C; return;
    case P_FCW: shape[0] = C; shape[1] = 4 * C; return;
    case P_FCPROJW: shape[0] = 4 * C; shape[1] = C; return;
    case P_QKVB: *ndim = 1; shape[0] = 3 * C; shape[1] = 1; return;
    case P_FCB: *ndim = 1; shape[0] = 4 * C; shape[1] = 1; return;
    default: *ndim = 1; shape[0] = C; shape[1] = 1; return;
    }
}

size_t dt_model_count_params(const dt_model_cfg *c) {
    size_t C = (size_t)c->n_embd, n = (size_t)c->vocab_size * C + (size_t)c->n_positions * C;
    for (int i = 0; i < P_PER_LAYER; i++) n += (size_t)c->n_layer * layer_numel(i, C);
    n += 2 * C + (size_t)c->num_labels * C;
    return n;
}

double dt_model_flops_per_token(const dt_model_cfg *c) {
    double C = c->n_embd, L = c->n_layer, T = c->seq_len;
    double n_matmul = L * 12.0 * C * C; /* c_attn 3C^2 + c_proj C^2 + c_fc 4C^2 + c_proj 4C^2 */
    if (c->num_labels == 0) n_matmul += (double)c->vocab_size * C; /* LM head */
    return 6.0 * n_matmul + 12.0 * L * C * T;
}

/* ---- the activation table: every buffer forward and backward use, sized once ---- */

enum { BUF_ACT, BUF_F32, BUF_I32, BUF_BYTES }; /* the backend's activation element, float, int, bytes */
#define ARENA_ALIGN 256             /* every buffer starts on a 256-byte boundary */
#define MAX_BUFS(L) (13 * (size_t)(L) + 24)

typedef struct act_buf {
    void **at;   /* the model's pointer to it (NULL when only sizing) */
    int kind;    /* BUF_* */
    size_t n;    /* elements */
} act_buf;

/* the head's width: the classes, or the vocabulary */
static int head_width(const dt_model_cfg *c) { return c->num_labels ? c->num_labels : c->vocab_size; }

/* The buffers of shape c, in arena order, into out (MAX_BUFS(L) entries); m NULL: sizes only.
 * att, datt: the bytes attention keeps per layer and its backward scratch (ops attention_bytes);
 * logits_ld: the logits' row stride (ops logits_stride).
 * Returns how many. The allocation (dt_model_init) and the estimate (dt_model_memory_bytes)
 * both come from here, so they cannot drift apart. */
static int act_table(const dt_model_cfg *c, dt_model *m, size_t att, size_t datt, int logits_ld, act_buf *out) {
    const size_t B = (size_t)c->max_batch, T = (size_t)c->seq_len, C = (size_t)c->n_embd, BT = B * T;
    const size_t NL = (size_t)c->num_labels;
    const size_t head_rows = NL ? B : BT; /* classification: the pooled rows only */
    int k = 0;
#define BUF(field, kind_, count) out[k++] = (act_buf){m ? (void **)&(m->field) : NULL, (kind_), (count)}
    BUF(encoded, BUF_ACT, BT * C);
    for (int l = 0; l < c->n_layer; l++) {
        BUF(layers[l].ln1, BUF_ACT, BT * C);
        BUF(layers[l].ln1_mean, BUF_F32, BT);
        BUF(layers[l].ln1_rstd, BUF_F32, BT);
        BUF(layers[l].qkv, BUF_ACT, BT * 3 * C);
        BUF(layers[l].atty, BUF_ACT, BT * C);
        BUF(layers[l].att, BUF_BYTES, att);
        BUF(layers[l].res2, BUF_ACT, BT * C);
        BUF(layers[l].ln2, BUF_ACT, BT * C);
        BUF(layers[l].ln2_mean, BUF_F32, BT);
        BUF(layers[l].ln2_rstd, BUF_F32, BT);
        BUF(layers[l].fch, BUF_ACT, BT * 4 * C);
        BUF(layers[l].fch_gelu, BUF_ACT, BT * 4 * C);
        BUF(layers[l].res3, BUF_ACT, BT * C);
    }
    if (NL) {
        BUF(pooled_in, BUF_ACT, B * C);
        BUF(dpooled, BUF_ACT, B * C);
        BUF(rows_dev, BUF_I32, B);
    }
    BUF(lnf, BUF_ACT, head_rows * C);
    BUF(lnf_mean, BUF_F32, head_rows);
    BUF(lnf_rstd, BUF_F32, head_rows);
    BUF(logits, BUF_ACT, head_rows * (size_t)logits_ld);
    BUF(targets_dev, BUF_I32, head_rows);
    BUF(losses, BUF_F32, BT);
    BUF(tokens_dev, BUF_I32, BT);
    BUF(argmax_dev, BUF_I32, BT);
    BUF(dresidual, BUF_ACT, BT * C);
    BUF(dln, BUF_ACT, BT * C);
    BUF(dqkv, BUF_ACT, BT * 3 * C);
    BUF(datt, BUF_BYTES, datt);
    BUF(dfch, BUF_ACT, BT * 4 * C);
    BUF(dfch_gelu, BUF_ACT, BT * 4 * C);
#undef BUF
    return k;
}

static size_t buf_bytes(const act_buf *b, dt_dtype act) {
    size_t bytes = b->n * (b->kind == BUF_ACT ? dt_dtype_size(act) : b->kind == BUF_BYTES ? 1 : 4);
    return (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

/* The arena's bytes for shape c on backend `ops` (ctx NULL: its estimate, ops.h attention_bytes),
 * with the table in `t` (MAX_BUFS entries) filled for m. */
static size_t table_bytes(const dt_model_cfg *c, dt_model *m, const dt_ops *ops, void *ctx, int bf16, act_buf *t,
                          int *n) {
    const dt_dtype act = ops->act_dtype(bf16);
    size_t total = 0, att, datt;
    ops->attention_bytes(ctx, c->max_batch, c->seq_len, c->n_embd, c->n_head, bf16, &att, &datt);
    *n = act_table(c, m, att, datt, ops->logits_stride(head_width(c)), t);
    for (int i = 0; i < *n; i++) total += buf_bytes(&t[i], act);
    return total;
}

size_t dt_model_memory_bytes(const dt_model_cfg *c, const dt_ops *ops, int bf16) {
    act_buf *t = malloc(MAX_BUFS(c->n_layer) * sizeof *t);
    if (!t) return SIZE_MAX;
    int n;
    size_t arena = table_bytes(c, NULL, ops, NULL, bf16, t, &n);
    free(t);
    return 2 * dt_model_count_params(c) * sizeof(float) + arena;
}

void dt_model_op_sizes(const dt_model_cfg *c, dt_op_sizes *s) {
    const size_t B = (size_t)c->max_batch, T = (size_t)c->seq_len, C = (size_t)c->n_embd, BT = B * T;
    const size_t head_out = c->num_labels ? B * (size_t)c->num_labels : BT * (size_t)c->vocab_size;
    memset(s, 0, sizeof *s);
    s->matmul_in = BT * 4 * C;                                     /* mlp.c_proj's input */
    s->matmul_out = head_out > BT * 4 * C ? head_out : BT * 4 * C; /* the logits, or mlp.c_fc's output */
    s->bias_rows = (int)BT;
    s->bias_cols = 4 * c->n_embd; /* mlp.c_fc.bias, the widest */
    s->att_batch = c->max_batch;
    s->att_seq = c->seq_len;
    s->att_width = c->n_embd;
    s->att_heads = c->n_head;
    s->ln_rows = (int)BT;
    s->ln_width = c->n_embd;
    s->enc_batch = c->max_batch;
    s->enc_seq = c->seq_len;
    s->vector = dt_model_count_params(c);
}

/* ---- init / free ---- */

static dt_status check_cfg(const dt_model_cfg *c) {
    if (c->n_layer < 1) return dt_error_set(DT_ERR_CONFIG, "model.n_layer: expected >= 1, got %d", c->n_layer);
    if (c->n_head < 1) return dt_error_set(DT_ERR_CONFIG, "model.n_head: expected >= 1, got %d", c->n_head);
    if (c->n_embd < 1 || c->n_embd % c->n_head)
        return dt_error_set(DT_ERR_CONFIG, "model.n_embd: expected a positive multiple of model.n_head (%d), got %d",
                            c->n_head, c->n_embd);
    if (c->vocab_size < 2) return dt_error_set(DT_ERR_CONFIG, "model.vocab_size: expected >= 2, got %d", c->vocab_size);
    if (c->num_labels == 1 || c->num_labels < 0)
        return dt_error_set(DT_ERR_CONFIG, "model.num_labels: expected 0 or >= 2, got %d", c->num_labels);
    if (c->seq_len < 1 || c->seq_len > c->n_positions)
        return dt_error_set(DT_ERR_CONFIG, "data.seq_len: expected 1..model.n_positions (%d), got %d",
                            c->n_positions, c->seq_len);
    if (c->max_batch < 1) return dt_error_set(DT_ERR_CONFIG, "data.batch_size_per_worker: expected >= 1, got %d", c->max_batch);
    return DT_OK;
}

static void add_tensor(dt_model *m, const char *name, int ndim, int s0, int s1, size_t *off, int bucket) {
    dt_tensor_info *t = &m->tensors[m->n_tensors++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = s0;
    t->shape[1] = ndim == 2 ? s1 : 1;
    t->numel = (size_t)s0 * (size_t)t->shape[1];
    t->offset = *off;
    t->bucket = bucket;
    *off += t->numel;
}

static void build_layout(dt_model *m) {
    const dt_model_cfg *c = &m->cfg;
    int C = c->n_embd, L = c->n_layer;
    size_t off = 0;
    add_tensor(m, "wte.weight", 2, c->vocab_size, C, &off, 0);
    add_tensor(m, "wpe.weight", 2, c->n_positions, C, &off, 0);
    for (int l = 0; l < L; l++) {
        for (int i = 0; i < P_PER_LAYER; i++) {
            char name[48];
            int ndim, shape[2];
            layer_shape(i, C, &ndim, shape);
            snprintf(name, sizeof name, "h.%d.%s", l, layer_tensor_names[i]);
            add_tensor(m, name, ndim, shape[0], shape[1], &off, 1 + l);
        }
    }
    add_tensor(m, "ln_f.weight", 1, C, 1, &off, L + 1);
    add_tensor(m, "ln_f.bias", 1, C, 1, &off, L + 1);
    if (c->num_labels) add_tensor(m, "score.weight", 2, c->num_labels, C, &off, L + 1);
    m->n_params = off;

    m->n_buckets = L + 2;
    for (int b = 0; b < m->n_buckets; b++) {
        m->buckets[b].offset = (size_t)-1;
        m->buckets[b].numel = 0;
        if (b == 0) snprintf(m->bucket_names[b], sizeof m->bucket_names[b], "embed");
        else if (b == L + 1) snprintf(m->bucket_names[b], sizeof m->bucket_names[b], "head");
        else snprintf(m->bucket_names[b], sizeof m->bucket_names[b], "h.%d", b - 1);
        m->buckets[b].name = m->bucket_names[b];
    }
    for (int i = 0; i < m->n_tensors; i++) {
        dt_bucket *b = &m->buckets[m->tensors[i].bucket];
        if (b->offset == (size_t)-1) b->offset = m->tensors[i].offset;
        b->numel += m->tensors[i].numel;
    }
}

/* splitmix64 + Box-Muller: a deterministic normal stream from the seed. */
typedef struct { uint64_t s; int have; double spare; } rng_t;
static uint64_t rng_u64(rng_t *r) {
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static double rng_normal(rng_t *r) {
    if (r->have) { r->have = 0; return r->spare; }
    double u1 = ((rng_u64(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0); /* (0,1] */
    double u2 = (rng_u64(r) >> 11) * (1.0 / 9007199254740992.0);
    double rad = sqrt(-2.0 * log(u1));
    r->spare = rad * sin(2.0 * M_PI * u2);
    r->have = 1;
    return rad * cos(2.0 * M_PI * u2);
}

static dt_status init_weights(dt_model *m) {
    float *host = dt_malloc(m->n_params * sizeof(float), "initial weights");
    if (!host) return DT_ERR_NOMEM;
    rng_t r = {m->cfg.seed, 0, 0.0};
    double resid_std = 0.02 / sqrt(2.0 * m->cfg.n_layer);
    for (int i = 0; i < m->n_tensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        float *p = host + t->offset;
        const char *n = t->name;
        size_t len = strlen(n);
        int is_ln_w = strstr(n, "ln_") && len > 7 && strcmp(n + len - 7, ".weight") == 0;
        if (t->ndim == 1) {
            for (size_t k = 0; k < t->numel; k++) p[k] = is_ln_w ? 1.0f : 0.0f;
        } else {
            double std = (strstr(n, "c_proj.weight") != NULL) ? resid_std : 0.02;
            for (size_t k = 0; k < t->numel; k++) p[k] = (float)(std * rng_normal(&r));
        }
    }
    m->be->ops->upload(m->be->ctx, m->params, host, m->n_params * sizeof(float));
    free(host);
    return DT_OK;
}

void dt_model_free(dt_model *m) {
    if (!m) return;
    const dt_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    if (m->params) o->set_master(ctx, NULL, 0);
    o->free(ctx, m->params);
    o->free(ctx, m->grads);
    o->free(ctx, m->arena);
    free(m->layers);
    free(m->tensors);
    free(m->buckets);
    free(m->bucket_names);
    free(m->host_losses);
    free(m->host_argmax);
    free(m->host_rows);
    free(m->host_probs);
    free(m->host_probs_f);
    free(m);
}

/* One allocation for every activation, and the table's pointers into it. */
static dt_status alloc_arena(dt_model *m) {
    act_buf *t = dt_malloc(MAX_BUFS(m->cfg.n_layer) * sizeof *t, "activation table");
    if (!t) return DT_ERR_NOMEM;
    int n;
    const dt_ops *o = m->be->ops;
    const size_t total = table_bytes(&m->cfg, m, o, m->be->ctx, o->bf16(m->be->ctx), t, &n);
    char what[96];
    snprintf(what, sizeof what, "the activations of batch %d (%.1f MiB)", m->cfg.max_batch, (double)total / (1 << 20));
    dt_status st = m->be->ops->alloc(m->be->ctx, total, what, &m->arena);
    size_t off = 0;
    for (int i = 0; st == DT_OK && i < n; i++) {
        *t[i].at = (char *)m->arena + off;
        off += buf_bytes(&t[i], m->act_dtype);
    }
    free(t);
    return st;
}

dt_status dt_model_init(dt_model **out, const dt_model_cfg *cfg, const dt_backend *be) {
    *out = NULL;
    DT_TRY(check_cfg(cfg));
    dt_status st = DT_ERR_NOMEM;
    dt_model *m = dt_calloc(1, sizeof *m, "model");
    if (!m) return DT_ERR_NOMEM;
    m->cfg = *cfg;
    m->be = be;
    m->act_dtype = be->ops->act_dtype(be->ops->bf16(be->ctx));
    m->logits_ld = be->ops->logits_stride(head_width(cfg));
    const size_t B = (size_t)cfg->max_batch, T = (size_t)cfg->seq_len, L = (size_t)cfg->n_layer, BT = B * T;

    m->tensors = dt_calloc(5 + L * P_PER_LAYER, sizeof *m->tensors, "tensor table");
    m->buckets = dt_calloc(L + 2, sizeof *m->buckets, "bucket table");
    m->bucket_names = dt_calloc(L + 2, sizeof *m->bucket_names, "bucket names");
    m->layers = dt_calloc(L, sizeof *m->layers, "layer activations");
    m->host_losses = dt_malloc(BT * sizeof(float), "loss staging");
    m->host_argmax = dt_malloc(BT * sizeof(int), "prediction staging");
    m->host_rows = dt_malloc(B * sizeof(int), "row staging");
    const size_t NLB = B * (size_t)(cfg->num_labels ? cfg->num_labels : 1);
    m->host_probs = dt_malloc((cfg->num_labels ? B * (size_t)m->logits_ld : 1) * sizeof(float), "probability staging");
    m->host_probs_f = dt_malloc(NLB * sizeof(float), "probabilities");
    if (!m->tensors || !m->buckets || !m->bucket_names || !m->layers || !m->host_losses ||
        !m->host_argmax || !m->host_rows || !m->host_probs || !m->host_probs_f)
        goto fail;
    build_layout(m);

    const dt_ops *o = be->ops;
    if ((st = o->alloc(be->ctx, m->n_params * sizeof(float), "parameters", (void **)&m->params)) != DT_OK ||
        (st = o->alloc(be->ctx, m->n_params * sizeof(float), "gradients", (void **)&m->grads)) != DT_OK)
        goto fail;
    o->set_master(be->ctx, m->params, m->n_params);
    if ((st = alloc_arena(m)) != DT_OK || (st = init_weights(m)) != DT_OK) goto fail;
    *out = m;
    return DT_OK;
fail:
    dt_model_free(m);
    return st;
}

const dt_model_cfg *dt_model_config(const dt_model *m) { return &m->cfg; }
const dt_backend *dt_model_backend(const dt_model *m) { return m->be; }
size_t dt_model_num_params(const dt_model *m) { return m->n_params; }
int dt_model_num_tensors(const dt_model *m) { return m->n_tensors; }
const dt_tensor_info *dt_model_tensor(const dt_model *m, int i) { return &m->tensors[i]; }
int dt_model_num_buckets(const dt_model *m) { return m->n_buckets; }
const dt_bucket *dt_model_bucket(const dt_model *m, int i) { return &m->buckets[i]; }
float *dt_model_params(dt_model *m) { return m->params; }
float *dt_model_grads(dt_model *m) { return m->grads; }

void dt_model_params_changed(dt_model *m) { m->be->ops->set_master(m->be->ctx, m->params, m->n_params); }

void dt_model_zero_grad(dt_model *m) { m->be->ops->zero(m->be->ctx, m->grads, m->n_params * sizeof(float)); }

/* pointer to layer l's tensor i in a flat buffer */
static float *lp(const dt_model *m, float *base, int l, int i) {
    return base + m->tensors[2 + l * P_PER_LAYER + i].offset;
}
static float *hp(const dt_model *m, float *base, int k) { /* 0 ln_f.w, 1 ln_f.b, 2 score */
    return base + m->tensors[2 + m->cfg.n_layer * P_PER_LAYER + k].offset;
}

/* ---- forward ---- */

/* The head's cross-entropy over `rows` rows of logits: the losses and, for training on a backend
 * that fuses it, the logits' gradient in place in the same pass (no probabilities; backward
 * uses it as it is); else the probabilities in place; and the predictions when asked. */
static void head_xent(dt_model *m, int rows, int predict, float scale) {
    const dt_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    const int V = head_width(&m->cfg), ld = m->logits_ld;
    m->logits_are_grads = !predict && o->xent_fused;
    m->fused_scale = scale;
    if (m->logits_are_grads) o->xent_fused(ctx, m->losses, m->logits, m->logits, m->targets_dev, scale, rows, V, ld);
    else o->xent_fwd(ctx, m->losses, m->logits, m->logits, m->targets_dev, rows, V, ld);
    if (predict) o->argmax(ctx, m->argmax_dev, m->logits, rows, V, ld);
}


static dt_status forward(dt_model *m, const int *tokens, const int *targets, int B, dt_fwd_result *res, int predict,
                         float scale) {
    const dt_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    const int T = m->cfg.seq_len, C = m->cfg.n_embd, NH = m->cfg.n_head, L = m->cfg.n_layer;
    const int V = m->cfg.vocab_size, NL = m->cfg.num_labels, ld = m->logits_ld;
    if (B < 1 || B > m->cfg.max_batch)
        return dt_error_set(DT_ERR_INTERNAL, "model forward: batch %d outside 1..%d", B, m->cfg.max_batch);
    const int BT = B * T;
    for (int i = 0; i < BT; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return dt_error_set(DT_ERR_DATA, "token %d at position %d is outside the vocabulary [0, %d) (hint: model.vocab_size)",
                                tokens[i], i, V);
    /* every input reaches the device before any work is queued: an upload waits for the
     * device, so one between the layers and the head would stall a GPU's queue */
    o->upload(ctx, m->tokens_dev, tokens, (size_t)BT * sizeof(int));
    if (NL) {
        /* pooled position: the last non-pad token of each sequence (pad 0 for bytes, whose texts
         * end in <cls>; the end-of-text id for BPE, as GPT2ForSequenceClassification does) */
        for (int b = 0; b < B; b++) {
            int pos = 0;
            for (int t = T - 1; t >= 0; t--)
                if (tokens[b * T + t] != m->cfg.pad_id) { pos = t; break; }
            m->host_rows[b] = b * T + pos;
            if (targets[b] < 0 || targets[b] >= NL)
                return dt_error_set(DT_ERR_DATA, "label %d outside [0, %d) (hint: model.num_labels)", targets[b], NL);
        }
        o->upload(ctx, m->rows_dev, m->host_rows, (size_t)B * sizeof(int));
        o->upload(ctx, m->targets_dev, targets, (size_t)B * sizeof(int));
    } else {
        o->upload(ctx, m->targets_dev, targets, (size_t)BT * sizeof(int));
    }

    o->encoder_fwd(ctx, m->encoded, m->tokens_dev, m->params + m->tensors[0].offset,
                   m->params + m->tensors[1].offset, B, T, C);
    const dt_act *x = m->encoded;
    for (int l = 0; l < L; l++) {
        layer_acts *a = &m->layers[l];
        float *p = m->params;
        o->layernorm_fwd(ctx, a->ln1, a->ln1_mean, a->ln1_rstd, x, lp(m, p, l, P_LN1W), lp(m, p, l, P_LN1B), BT, C);
        o->matmul_fwd(ctx, a->qkv, a->ln1, lp(m, p, l, P_QKVW), lp(m, p, l, P_QKVB), BT, C, 3 * C, 3 * C, 0);
        o->attention_fwd(ctx, a->atty, a->att, a->qkv, B, T, C, NH);
        o->matmul_fwd(ctx, a->res2, a->atty, lp(m, p, l, P_ATTPROJW), lp(m, p, l, P_ATTPROJB), BT, C, C, C, 0);
        o->add(ctx, a->res2, a->res2, x, (size_t)BT * C);
        o->layernorm_fwd(ctx, a->ln2, a->ln2_mean, a->ln2_rstd, a->res2, lp(m, p, l, P_LN2W), lp(m, p, l, P_LN2B), BT, C);
        if (o->matmul_gelu_fwd) /* the backend's fused product and GELU (ops.h) */
            o->matmul_gelu_fwd(ctx, a->fch_gelu, a->fch, a->ln2, lp(m, p, l, P_FCW), lp(m, p, l, P_FCB), BT, C, 4 * C);
        else {
            o->matmul_fwd(ctx, a->fch, a->ln2, lp(m, p, l, P_FCW), lp(m, p, l, P_FCB), BT, C, 4 * C, 4 * C, 0);
            o->gelu_fwd(ctx, a->fch_gelu, a->fch, (size_t)BT * 4 * C);
        }
        o->matmul_fwd(ctx, a->res3, a->fch_gelu, lp(m, p, l, P_FCPROJW), lp(m, p, l, P_FCPROJB), BT, 4 * C, C, C, 0);
        o->add(ctx, a->res3, a->res3, a->res2, (size_t)BT * C);
        x = a->res3;
    }

    memset(res, 0, sizeof *res);
    if (NL) {
        o->gather_rows(ctx, m->pooled_in, x, m->rows_dev, B, C);
        o->layernorm_fwd(ctx, m->lnf, m->lnf_mean, m->lnf_rstd, m->pooled_in, hp(m, m->params, 0), hp(m, m->params, 1), B, C);
        o->matmul_fwd(ctx, m->logits, m->lnf, hp(m, m->params, 2), NULL, B, C, NL, ld, 1);
        head_xent(m, B, predict, scale);
        o->download(ctx, m->host_losses, m->losses, (size_t)B * sizeof(float));
        if (predict) o->download(ctx, m->host_argmax, m->argmax_dev, (size_t)B * sizeof(int));
        if (!m->logits_are_grads) o->download(ctx, m->host_probs, m->logits, (size_t)B * ld * dt_dtype_size(m->act_dtype));
        for (int b = 0; b < B; b++) {
            if (predict) res->correct += m->host_argmax[b] == targets[b];
            res->loss_sum += m->host_losses[b];
        }
        for (size_t b = 0; !m->logits_are_grads && b < (size_t)B; b++)
            for (size_t j = 0; j < (size_t)NL; j++) {
                const size_t i = b * (size_t)ld + j;
                m->host_probs_f[b * (size_t)NL + j] = m->act_dtype == DT_DTYPE_F32
                                                          ? ((const float *)m->host_probs)[i]
                                                          : dt_bf16_to_float(((const uint16_t *)m->host_probs)[i]);
            }
        res->rows = B;
        res->pred = predict ? m->host_argmax : NULL;
        res->probs = m->logits_are_grads ? NULL : m->host_probs_f;
        res->losses = m->host_losses;
    } else {
        o->layernorm_fwd(ctx, m->lnf, m->lnf_mean, m->lnf_rstd, x, hp(m, m->params, 0), hp(m, m->params, 1), BT, C);
        o->matmul_fwd(ctx, m->logits, m->lnf, m->params + m->tensors[0].offset, NULL, BT, C, V, ld, 1);
        head_xent(m, BT, predict, scale);
        o->download(ctx, m->host_losses, m->losses, (size_t)BT * sizeof(float));
        if (predict) o->download(ctx, m->host_argmax, m->argmax_dev, (size_t)BT * sizeof(int));
        for (int i = 0; i < BT; i++) {
            if (targets[i] < 0) continue;
            if (predict) res->correct += m->host_argmax[i] == targets[i];
            res->loss_sum += m->host_losses[i];
            res->rows++;
        }
        res->pred = predict ? m->host_argmax : NULL;
    }
    m->last_B = B;
    return o->check(ctx);
}

dt_status dt_model_forward(dt_model *m, const int *tokens, const int *targets, int B, dt_fwd_result *res) {
    return forward(m, tokens, targets, B, res, 1, 0.0f);
}

dt_status dt_model_forward_loss(dt_model *m, const int *tokens, const int *targets, int B, float scale,
                                dt_fwd_result *res) {
    return forward(m, tokens, targets, B, res, 0, scale);
}

/* ---- backward ---- */

dt_status dt_model_backward(dt_model *m, float scale, dt_bucket_ready_fn ready, void *user) {
    const dt_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    const int B = m->last_B, T = m->cfg.seq_len, C = m->cfg.n_embd, NH = m->cfg.n_head;
    const int L = m->cfg.n_layer, V = m->cfg.vocab_size, NL = m->cfg.num_labels, BT = B * T, ld = m->logits_ld;
    if (B == 0) return dt_error_set(DT_ERR_INTERNAL, "model backward called without a forward");
    float *p = m->params, *g = m->grads;
    const dt_act *xL = m->layers[L - 1].res3;

    const size_t asz = dt_dtype_size(m->act_dtype);
    o->zero(ctx, m->dresidual, (size_t)BT * C * asz);
    if (m->logits_are_grads && scale != m->fused_scale)
        return dt_error_set(DT_ERR_INTERNAL, "model backward: scale %g, but the forward computed the gradient for %g",
                            (double)scale, (double)m->fused_scale);
    const int head_rows = NL ? B : BT;
    if (!m->logits_are_grads) o->xent_bwd(ctx, m->logits, m->logits, m->targets_dev, scale, head_rows, NL ? NL : V, ld);
    m->logits_are_grads = 0;
    if (NL) {
        o->matmul_bwd(ctx, m->dln, hp(m, g, 2), NULL, m->logits, m->lnf, hp(m, p, 2), B, C, NL, ld, 1);
        o->zero(ctx, m->dpooled, (size_t)B * C * asz);
        o->layernorm_bwd(ctx, m->dpooled, hp(m, g, 0), hp(m, g, 1), m->dln, m->pooled_in, hp(m, p, 0),
                         m->lnf_mean, m->lnf_rstd, B, C);
        o->scatter_add_rows(ctx, m->dresidual, m->dpooled, m->rows_dev, B, C);
    } else {
        o->matmul_bwd(ctx, m->dln, g + m->tensors[0].offset, NULL, m->logits, m->lnf, p + m->tensors[0].offset,
                      BT, C, V, ld, 1);
        o->layernorm_bwd(ctx, m->dresidual, hp(m, g, 0), hp(m, g, 1), m->dln, xL, hp(m, p, 0),
                         m->lnf_mean, m->lnf_rstd, BT, C);
    }
    if (ready) ready(user, L + 1);

    for (int l = L - 1; l >= 0; l--) {
        layer_acts *a = &m->layers[l];
        const dt_act *x = l == 0 ? m->encoded : m->layers[l - 1].res3;
        /* MLP: res3 = res2 + c_proj(gelu(c_fc(ln_2(res2)))) */
        if (o->matmul_gelu_bwd)
            o->matmul_gelu_bwd(ctx, m->dfch, m->dfch_gelu, lp(m, g, l, P_FCPROJW), lp(m, g, l, P_FCPROJB), m->dresidual,
                               a->fch_gelu, lp(m, p, l, P_FCPROJW), a->fch, BT, 4 * C, C);
        else {
            o->matmul_bwd(ctx, m->dfch_gelu, lp(m, g, l, P_FCPROJW), lp(m, g, l, P_FCPROJB), m->dresidual,
                          a->fch_gelu, lp(m, p, l, P_FCPROJW), BT, 4 * C, C, C, 0);
            o->gelu_bwd(ctx, m->dfch, a->fch, m->dfch_gelu, (size_t)BT * 4 * C);
        }
        o->matmul_bwd(ctx, m->dln, lp(m, g, l, P_FCW), lp(m, g, l, P_FCB), m->dfch, a->ln2,
                      lp(m, p, l, P_FCW), BT, C, 4 * C, 4 * C, 0);
        o->layernorm_bwd(ctx, m->dresidual, lp(m, g, l, P_LN2W), lp(m, g, l, P_LN2B), m->dln, a->res2,
                         lp(m, p, l, P_LN2W), a->ln2_mean, a->ln2_rstd, BT, C);
        /* attention: res2 = x + c_proj(attn(c_attn(ln_1(x)))) */
        o->matmul_bwd(ctx, m->dln, lp(m, g, l, P_ATTPROJW), lp(m, g, l, P_ATTPROJB), m->dresidual,
                      a->atty, lp(m, p, l, P_ATTPROJW), BT, C, C, C, 0);
        o->attention_bwd(ctx, m->dqkv, m->datt, m->dln, a->qkv, a->atty, a->att, B, T, C, NH);
        o->matmul_bwd(ctx, m->dln, lp(m, g, l, P_QKVW), lp(m, g, l, P_QKVB), m->dqkv, a->ln1,
                      lp(m, p, l, P_QKVW), BT, C, 3 * C, 3 * C, 0);
        o->layernorm_bwd(ctx, m->dresidual, lp(m, g, l, P_LN1W), lp(m, g, l, P_LN1B), m->dln, x,
                         lp(m, p, l, P_LN1W), a->ln1_mean, a->ln1_rstd, BT, C);
        if (ready) ready(user, 1 + l);
    }
    o->encoder_bwd(ctx, g + m->tensors[0].offset, g + m->tensors[1].offset, m->dresidual, m->tokens_dev, B, T, C);
    if (ready) ready(user, 0);
    return DT_OK;
}

/* ---- weights I/O ---- */

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

dt_status dt_model_save(dt_model *m, const char *path) { return dt_model_save_prefixed(m, path, ""); }

dt_status dt_model_save_prefixed(dt_model *m, const char *path, const char *prefix) {
    float *host = dt_malloc(m->n_params * sizeof(float), "weights staging");
    dt_st_entry *e = dt_calloc((size_t)m->n_tensors, sizeof *e, "tensor list");
    char(*names)[64] = prefix[0] ? dt_calloc((size_t)m->n_tensors, sizeof *names, "tensor names") : NULL;
    dt_status st = DT_ERR_NOMEM;
    if (host && e && (names || !prefix[0])) {
        m->be->ops->download(m->be->ctx, host, m->params, m->n_params * sizeof(float));
        for (int i = 0; i < m->n_tensors; i++) {
            const dt_tensor_info *t = &m->tensors[i];
            e[i].name = t->name;
            if (names && strcmp(t->name, "score.weight") != 0) {
                snprintf(names[i], sizeof names[i], "%s%s", prefix, t->name);
                e[i].name = names[i];
            }
            e[i].ndim = t->ndim;
            e[i].shape[0] = t->shape[0];
            e[i].shape[1] = t->shape[1];
            e[i].data = host + t->offset;
        }
        const char *keys[] = {"format", "producer"};
        const char *vals[] = {"pt", "dtrain"};
        /* a device that failed earlier must not leave a well-checksummed file of garbage */
        if ((st = m->be->ops->check(m->be->ctx)) == DT_OK) st = dt_st_write(path, e, m->n_tensors, keys, vals, 2);
    }
    free(host);
    free(e);
    free(names);
    return st;
}

/* Maps a file tensor name to ours: strips "transformer."; returns NULL for names to ignore. */
static const char *canonical_name(const char *name) {
    if (strncmp(name, "transformer.", 12) == 0) name += 12;
    size_t n = strlen(name);
    if ((n > 10 && strcmp(name + n - 10, ".attn.bias") == 0) ||
        (n > 17 && strcmp(name + n - 17, ".attn.masked_bias") == 0) || strcmp(name, "lm_head.weight") == 0)
        return NULL;
    return name;
}

dt_status dt_check_finite(const float *v, size_t n, const char *path, const char *name) {
    /* the common case at memory speed: an exponent of all ones (NaN or Inf) anywhere? */
    const uint32_t *bits = (const uint32_t *)(const void *)v;
    uint32_t any = 0;
    for (size_t i = 0; i < n; i++) any |= (bits[i] & 0x7f800000u) == 0x7f800000u;
    if (!any) return DT_OK;
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]) && bad++ == 0) first = i;
    return dt_error_set(DT_ERR_DATA, "%s: tensor %s holds %s at element %zu (%zu value%s NaN or Inf): not usable weights",
                        path, name, isnan(v[first]) ? "NaN" : v[first] > 0 ? "+Inf" : "-Inf", first, bad,
                        bad == 1 ? " is" : "s are");
}

/* A file's lm_head.weight: dtrain ties the output head to wte, so it must hold the same values
 * (GPT-2 files that store it do); an untied head is refused rather than silently dropped. */
static dt_status check_tied_head(dt_st_file *f, const dt_st_tensor *lm, const dt_model *m, const float *host,
                                 const char *path) {
    int j = 0;
    while (j < m->n_tensors && strcmp(m->tensors[j].name, "wte.weight") != 0) j++;
    const dt_tensor_info *wte = &m->tensors[j];
    if (lm->ndim != 2 || lm->shape[0] != wte->shape[0] || lm->shape[1] != wte->shape[1])
        return dt_error_set(DT_ERR_DATA, "%s: tensor %s does not have wte.weight's shape: an untied output head, which "
                                         "dtrain cannot represent (its head is the token embedding)", path, lm->name);
    float *v = dt_malloc(wte->numel * sizeof(float), "lm_head staging");
    if (!v) return DT_ERR_NOMEM;
    dt_status st = dt_st_read_f32(f, lm, v);
    size_t i = 0;
    if (st == DT_OK)
        while (i < wte->numel && v[i] == host[wte->offset + i]) i++;
    if (st == DT_OK && i < wte->numel)
        st = dt_error_set(DT_ERR_DATA, "%s: tensor %s differs from wte.weight (first at element %zu): an untied output "
                                       "head, which dtrain cannot represent (its head is the token embedding)",
                          path, lm->name, i);
    free(v);
    return st;
}

/* A hint with the config values the file implies. */
static void file_shape_hint(const dt_st_file *f, char *buf, size_t n) {
    int64_t V = -1, P = -1, C = -1, L = 0, NL = -1;
    for (int i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        const char *nm = canonical_name(t->name);
        if (!nm) continue;
        if (strcmp(nm, "wte.weight") == 0 && t->ndim == 2) { V = t->shape[0]; C = t->shape[1]; }
        else if (strcmp(nm, "wpe.weight") == 0 && t->ndim == 2) P = t->shape[0];
        else if (strcmp(nm, "score.weight") == 0 && t->ndim == 2) NL = t->shape[0];
        else if (strncmp(nm, "h.", 2) == 0) {
            long l = strtol(nm + 2, NULL, 10);
            if (l + 1 > L) L = l + 1;
        }
    }
    size_t k = (size_t)snprintf(buf, n, "the file has model.vocab_size %lld, n_positions %lld, n_embd %lld, n_layer %lld",
                                (long long)V, (long long)P, (long long)C, (long long)L);
    if (NL > 0 && k < n) snprintf(buf + k, n - k, ", num_labels %lld", (long long)NL);
}

dt_status dt_model_load(dt_model *m, const char *path, int *score_loaded) {
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(&f, path));
    dt_status st = DT_OK;
    char hint[256], a[64], b[64];
    int *seen = dt_calloc((size_t)m->n_tensors, sizeof *seen, "tensor flags");
    float *host = dt_malloc(m->n_params * sizeof(float), "weights staging");
    if (!seen || !host) { st = DT_ERR_NOMEM; goto done; }
    m->be->ops->download(m->be->ctx, host, m->params, m->n_params * sizeof(float));
    file_shape_hint(f, hint, sizeof hint);

    const dt_st_tensor *lm_head = NULL;
    for (int i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        const char *nm = canonical_name(t->name);
        if (!nm && strcmp(t->name, "lm_head.weight") == 0) lm_head = t;
        if (!nm) continue;
        int j = 0;
        while (j < m->n_tensors && strcmp(m->tensors[j].name, nm) != 0) j++;
        if (j == m->n_tensors) {
            if (strcmp(nm, "score.weight") == 0 && m->cfg.num_labels == 0) continue; /* classifier -> LM */
            st = dt_error_set(DT_ERR_DATA, "%s: tensor %s is not part of this model (hint: %s)", path, t->name, hint);
            goto done;
        }
        const dt_tensor_info *mt = &m->tensors[j];
        int64_t want[2] = {mt->shape[0], mt->shape[1]};
        int ok = t->ndim == mt->ndim && t->shape[0] == want[0] && (mt->ndim == 1 || t->shape[1] == want[1]);
        if (!ok) {
            shape_str(a, sizeof a, t->ndim, t->shape);
            shape_str(b, sizeof b, mt->ndim, want);
            st = dt_error_set(DT_ERR_DATA, "%s: tensor %s has shape %s but the config needs %s (hint: %s)", path,
                              t->name, a, b, hint);
            goto done;
        }
        if (seen[j]) {
            st = dt_error_set(DT_ERR_DATA, "%s: tensor %s appears twice (with and without the transformer. prefix)", path, nm);
            goto done;
        }
        if ((st = dt_st_read_f32(f, t, host + mt->offset)) != DT_OK ||
            (st = dt_check_finite(host + mt->offset, mt->numel, path, t->name)) != DT_OK)
            goto done;
        seen[j] = 1;
    }
    int score_ok = 1;
    for (int j = 0; j < m->n_tensors; j++) {
        if (seen[j]) continue;
        if (strcmp(m->tensors[j].name, "score.weight") == 0) { score_ok = 0; continue; }
        st = dt_error_set(DT_ERR_DATA, "%s: tensor %s is missing (hint: %s)", path, m->tensors[j].name, hint);
        goto done;
    }
    if (lm_head && (st = check_tied_head(f, lm_head, m, host, path)) != DT_OK) goto done;
    if (score_loaded) *score_loaded = score_ok;
    m->be->ops->upload(m->be->ctx, m->params, host, m->n_params * sizeof(float));
done:
    free(seen);
    free(host);
    dt_st_close(f);
    return st;
}
