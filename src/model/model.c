/* model.c — the model over the op table: its tensors (laid out by the architecture, net.h),
 * the activation arena, forward/backward (embedding, the layers of net.c, the head) and
 * weights I/O.
 *
 * This file never calls BLAS or CUDA: every numeric step goes through dt_ops, with
 * pointers the backend allocated. Host memory is used only for inputs (tokens, targets)
 * before upload, for the results of forward (evaluation) and for the weights file round trip.
 * A training forward (dt_model_forward_train) neither downloads nor waits: its inputs go through
 * upload_async, its loss stays on the device until the step reads it once. */
#include "dtrain/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zlib.h>

#include "dtrain/bf16.h"
#include "dtrain/clock.h"
#include "dtrain/safetensors.h"
#include "net.h"

struct dt_model {
    dt_model_cfg cfg;
    const dt_backend *be;
    dt_net net;                /* the ops, the architecture, the parameters and their named offsets */

    int n_tensors;
    dt_tensor_info *tensors;   /* (n_tensors) host: the frozen ones (model.lora), then the trainable ones */
    net_init *init;            /* (n_tensors) how each starts */
    double *init_std;          /* (n_tensors) */
    int *seq;                  /* (n_tensors) the tensor laid out k-th (the order init draws in) */
    int n_frozen_tensors;      /* tensors [0, this) are frozen */
    size_t n_frozen;           /* their floats */
    size_t *store;             /* (n_tensors) where each is kept: an offset in net.params, or NET_BF16 | an offset in
                                  net.base16 (model.lora.base_dtype bf16: the frozen matrices); without base16 its
                                  offset. The named offsets of net.w are these. */
    size_t n_store;            /* floats of net.params */
    size_t n_base16;           /* elements of net.base16 */
    uint16_t *base16;          /* backend memory: net.base16 */
    dt_tensor_info *view;      /* the trainable tensors, offsets from the first one's (= tensors without LoRA) */
    uint32_t base_digest;      /* dt_model_frozen_digest, once computed (base_digest_ok) since the frozen ones changed */
    int base_digest_ok;
    int n_buckets;
    dt_bucket *buckets;        /* (n_buckets) host */
    char (*bucket_names)[16];
    size_t n_params;
    size_t n_whole;            /* the trainable tensors' floats whole (tensor parallelism: more than theirs here) */

    /* activations for max_batch: pointers into one arena (act_table): the buffers every set
     * shares, then act_sets sets of the others (dt_model_use_acts) */
    void *arena;
    struct act_buf *act_tab;   /* (n_act_tab) the table, for moving the pointers to another set */
    size_t *act_off;           /* (n_act_tab) each buffer's offset: in the shared part, or in a set */
    int n_act_tab;
    size_t shared_bytes, set_bytes;
    dt_act *encoded;           /* (B,T,C) residual stream input of layer 0 */
    net_acts *layers;          /* (L) */
    dt_act *lnf;               /* the final norm's output. LM: (B,T,C); cls: (B,C) */
    float *lnf_mean, *lnf_rstd;/* LM: (B,T); cls: (B) */
    dt_act *pooled_in;         /* cls: (B,C) residual rows at the pooled positions */
    dt_act *logits;            /* LM: (B,T,V); cls: (B,num_labels); probs/dlogits in place; rows
                                  logits_ld apart */
    int logits_ld;             /* the backend's row stride for them (ops logits_stride) */
    float *losses;             /* (B*T) */
    int *tokens_dev;           /* (B,T) */
    int *pos_dev;              /* packed: (B,T) each token's position in its example (dt_model_set_positions) */
    int pos_B;                 /* packed: the batch the positions were given for (0: none yet) */
    int *targets_dev;          /* LM (B,T), cls (B) */
    int *rows_dev;             /* cls: (B) pooled row indices b*T + pos */
    int *argmax_dev;           /* (B*T) LM, (B) cls: predicted class of each row */
    float *xent_stats;         /* tensor parallelism, LM: (B*T, 4) this share's xent_part_stats */
    float *xent_lse;           /* ... (B*T) the whole rows' log-sum-exp, for backward */
    float *host_stats;         /* ... host (tp, B*T, 4): every share's; then this share's (B*T, 4), the lse (B*T) */

    net_grads d;               /* backward scratch */
    dt_act *dpooled;           /* cls: (B,C) */

    /* host staging */
    float *host_losses;        /* (B*T) */
    int *host_argmax;          /* (B*T) */
    int *host_rows;            /* (B) */
    void *host_probs;          /* cls: (B,logits_ld) the activation element, as downloaded */
    float *host_probs_f;       /* cls: (B,num_labels) as floats */

    double *loss_dev;          /* (1) the training loss's sum since the last fetch (dt_model_forward_train) */
    double *loss_host;         /* backend host memory (alloc_host): what dt_model_loss_fetch copied */

    int last_B;                /* batch of the last forward, 0 = none */
    int T;                     /* the rows' length the next forwards take (dt_model_set_length) */
    int last_T;                /* ... the last forward took: its backward's */
    dt_status tp_st;           /* tensor parallelism: the first failure of a sum over cfg.tp_comm (net.tp_st) */
    double tp_ms;              /* ... the time spent in those collectives (net.tp_ms) */
    struct logits_held {       /* (act_sets) per set of activations, what its logits hold: */
        int grads;             /* the gradient its last forward left (ops xent_fused), */
        float scale;           /* ... for this scale */
    } *held;
    int set;                   /* the set in use (dt_model_use_acts) */
};

/* ---- layout: the architecture's tensors ---- */

/* model.lora: the adapters on each layer (one a target) */
static int lora_per_layer(const dt_model_cfg *c) {
    int k = 0;
    for (int t = 0; c->lora.rank && t < dt_lora_target_count(); t++) k += (c->lora.targets >> t) & 1u;
    return k;
}

/* model.lora's adapters, after the architecture's tensors: for each layer, each target's A
 * (rank, in) and B (cols, rank), in the layer's bucket, attached to the product they adapt,
 * numbered in the layer (their slots in net_acts lora_h, lora_per_layer of them). Tensor
 * parallelism splits them with their product: B by rows (the output columns it makes) where the
 * product is split by columns, A by columns (its input's) where it is split by rows. */
static void add_adapters(net_builder *b, const net_arch *a, net_weights *w) {
    const dt_model_shape *s = &b->cfg->shape;
    const int r = b->cfg->lora.rank, tp = b->tp > 1 ? b->tp : 1;
    char nm[128];
    for (int l = 0; l < s->n_layer; l++)
        for (int t = 0, slot = 0; t < dt_lora_target_count(); t++) {
            if (!(b->cfg->lora.targets & (1u << t))) continue;
            net_linear *lin;
            int col0, cols, sections;
            a->lora_site(s, t, &w->layers[l], &lin, &col0, &cols, &sections);
            const int by_cols = tp > 1 && lin->tp == NET_TP_COLS, by_rows = tp > 1 && lin->tp == NET_TP_ROWS;
            const int in = by_rows ? lin->in * tp : lin->in; /* the whole product's */
            net_lora *ad = &lin->lora[lin->n_lora++];
            ad->col0 = by_cols ? col0 / tp : col0; /* this share's columns: every block splits evenly */
            ad->cols = by_cols ? cols / tp : cols;
            ad->slot = slot++;
            snprintf(nm, sizeof nm, "%s%d.%s.lora_A.weight", a->layer_prefix, l, dt_lora_target_module(t));
            ad->a = dt_net_add_split(b, nm, r, in, NET_INIT_UNIFORM, 1.0 / sqrt((double)in), 1, 1 + l,
                                     by_rows ? DT_SPLIT_COLS : DT_SPLIT_NONE, 1);
            snprintf(nm, sizeof nm, "%s%d.%s.lora_B.weight", a->layer_prefix, l, dt_lora_target_module(t));
            ad->b = dt_net_add_split(b, nm, cols, r, NET_INIT_ZERO, 0, 1, 1 + l, by_cols ? DT_SPLIT_ROWS : DT_SPLIT_NONE,
                                     sections);
        }
}

/* With model.lora: trainable are the adapters (tensors from n_arch on) and the score head. */
static int is_trainable(const dt_model_cfg *c, const char *name, int i, int n_arch) {
    return !c->lora.rank || i >= n_arch || strcmp(name, "score.weight") == 0;
}

/* Offsets moved: tensor i (of n, its info t[i]) from from[i] to to[i]. A tensor another pipeline
 * stage holds has no elements here, so its offset is the next one's: a named offset goes to the
 * tensor held there, to the absent one only when no held one has it. */
typedef struct remap {
    const size_t *from, *to;
    const dt_tensor_info *t;
    int n;
} remap;

static void remap_one(size_t *off, const remap *r) {
    if (*off == NET_NONE) return;
    int absent = -1;
    for (int i = 0; i < r->n; i++)
        if (r->from[i] == *off) {
            if (r->t[i].absent) {
                if (absent < 0) absent = i;
                continue;
            }
            *off = r->to[i];
            return;
        }
    if (absent >= 0) *off = r->to[absent];
}

static void remap_linear(net_linear *x, const remap *r) {
    remap_one(&x->w, r);
    remap_one(&x->b, r);
    for (int i = 0; i < x->n_lora; i++) {
        remap_one(&x->lora[i].a, r);
        remap_one(&x->lora[i].b, r);
    }
}

/* every named offset of w that is one of r's moved */
static void remap_weights(net_weights *w, int L, const remap *r) {
    remap_one(&w->wte, r);
    remap_one(&w->wpe, r);
    for (int l = 0; l < L; l++) {
        net_layer *y = &w->layers[l];
        remap_one(&y->attn_norm.w, r);
        remap_one(&y->attn_norm.b, r);
        remap_one(&y->mlp_norm.w, r);
        remap_one(&y->mlp_norm.b, r);
        remap_linear(&y->qkv, r);
        remap_linear(&y->attn_out, r);
        remap_linear(&y->mlp_in, r);
        remap_linear(&y->mlp_out, r);
    }
    remap_one(&w->final_norm.w, r);
    remap_one(&w->final_norm.b, r);
    remap_linear(&w->head, r);
}

/* model.lora: the tensors reordered, frozen ones first (in layout order), then the trainable
 * ones by bucket (so that every bucket is one range of the trainable buffer, in bucket order),
 * and every named offset in w moved with them. */
static dt_status put_trainable_last(dt_model *m, int n_arch) {
    const int n = m->n_tensors, L = m->cfg.shape.n_layer;
    dt_tensor_info *t = dt_malloc((size_t)n * sizeof *t, "tensor table");
    net_init *init = dt_malloc((size_t)n * sizeof *init, "tensor table");
    double *sd = dt_malloc((size_t)n * sizeof *sd, "tensor table");
    size_t *from = dt_malloc((size_t)n * sizeof *from, "tensor table"), *to = dt_malloc((size_t)n * sizeof *to, "tensor table");
    int *where = dt_malloc((size_t)n * sizeof *where, "tensor table");
    dt_status st = t && init && sd && from && to && where ? DT_OK : DT_ERR_NOMEM;
    int k = 0;
    size_t off = 0;
    for (int pass = 0; st == DT_OK && pass < 2; pass++)
        for (int bucket = 0; bucket < (pass ? L + 2 : 1); bucket++)
            for (int i = 0; i < n; i++) {
                const int tr = is_trainable(&m->cfg, m->tensors[i].name, i, n_arch);
                if (pass != tr || (pass && m->tensors[i].bucket != bucket)) continue;
                t[k] = m->tensors[i];
                init[k] = m->init[i];
                sd[k] = m->init_std[i];
                from[k] = m->tensors[i].offset;
                to[k] = t[k].offset = off;
                where[i] = k;
                off += t[k].numel;
                if (!pass) m->n_frozen_tensors = k + 1, m->n_frozen = off;
                k++;
            }
    if (st != DT_OK) goto done;
    memcpy(m->tensors, t, (size_t)n * sizeof *t);
    memcpy(m->init, init, (size_t)n * sizeof *init);
    memcpy(m->init_std, sd, (size_t)n * sizeof *sd);
    for (int i = 0; i < n; i++) m->seq[i] = where[i];
    remap_weights(&m->net.w, L, &(remap){from, to, t, n});
done:
    free(t);
    free(init);
    free(sd);
    free(from);
    free(to);
    free(where);
    return st;
}

/* The tensors of shape c through the architecture's layout (and model.lora's adapters):
 * counted (m NULL: *n, *n_params, *n_train and *n16 only; DT_OK), or laid out into m (its
 * tables allocated for *n), the trainable ones last. w0: layer 0's products (widths); n_train,
 * w0, n16 may be NULL. *n16: the parameters model.lora.base_dtype bf16 keeps in bf16 (the
 * frozen matrices), 0 without it. buckets (NULL, or n_layer + 2 zeros): the trainable floats of
 * each gradient bucket. */
static dt_status lay_out(const dt_model_cfg *c, dt_model *m, int *n, size_t *n_params, size_t *n_train, net_layer *w0,
                         size_t *n16, size_t *buckets) {
    const net_arch *a = dt_net_arch(c->shape.arch);
    net_builder b = {.cfg = c, .tp = c->tp > 1 ? c->tp : 1, .tp_rank = c->tp > 1 ? c->tp_rank : 0,
                     .bucket_numel = buckets};
    net_weights tmp = {0};
    net_weights *w = m ? &m->net.w : &tmp;
    if (m) {
        b.tensors = m->tensors;
        b.init = m->init;
        b.std = m->init_std;
    } else {
        tmp.layers = calloc((size_t)c->shape.n_layer, sizeof *tmp.layers);
        if (!tmp.layers) { /* for the sizes of --dry-run only: a model that big cannot be built anyway */
            *n = 0;
            *n_params = SIZE_MAX;
            if (n_train) *n_train = SIZE_MAX;
            if (n16) *n16 = 0;
            return DT_OK;
        }
    }
    a->layout(&b, w);
    const int n_arch = b.n;
    size_t train = 0, frozen16 = c->lora.rank && c->lora.base_bf16 ? b.mat : 0;
    dt_status st = DT_OK;
    if (c->lora.rank) {
        /* the score head stays trainable, where this stage holds it (the last: its bucket's owner) */
        const int L = c->shape.n_layer, pp = c->pp > 1;
        const size_t head = c->shape.num_labels && (!pp || dt_net_stage_owns(c, c->pp_rank, L + 1))
                                ? (size_t)w->head.in * (size_t)w->head.out : 0;
        train += head;
        if (frozen16) frozen16 -= head; /* b.mat counted it among the matrices */
        if (buckets) { /* the gradients' buckets hold the trainable ones */
            memset(buckets, 0, ((size_t)L + 2) * sizeof *buckets);
            buckets[L + 1] = head;
        }
        const size_t before = b.off;
        add_adapters(&b, a, w);
        train += b.off - before;
    } else {
        train = b.off;
    }
    *n = b.n;
    *n_params = b.off;
    if (n_train) *n_train = train;
    if (n16) *n16 = frozen16;
    if (m) {
        for (int i = 0; i < b.n; i++) m->seq[i] = i;
        if (c->lora.rank) st = put_trainable_last(m, n_arch);
    }
    if (w0) *w0 = w->layers[0];
    free(tmp.layers);
    return st;
}

size_t dt_model_count_params(const dt_model_cfg *c) {
    int n;
    size_t np;
    lay_out(c, NULL, &n, &np, NULL, NULL, NULL, NULL);
    return np;
}

size_t dt_model_count_trainable(const dt_model_cfg *c) {
    int n;
    size_t np, nt;
    lay_out(c, NULL, &n, &np, &nt, NULL, NULL, NULL);
    return nt;
}

size_t dt_model_largest_bucket(const dt_model_cfg *c) {
    size_t *per = calloc((size_t)c->shape.n_layer + 2, sizeof *per), np, most = 0;
    int n;
    if (per && lay_out(c, NULL, &n, &np, NULL, NULL, NULL, per) == DT_OK && np != SIZE_MAX)
        for (int i = 0; i < c->shape.n_layer + 2; i++) most = per[i] > most ? per[i] : most;
    free(per);
    return most;
}

size_t dt_model_param_bytes(const dt_model_cfg *c) {
    int n;
    size_t np, n16;
    lay_out(c, NULL, &n, &np, NULL, NULL, &n16, NULL);
    return (np - n16) * sizeof(float) + n16 * sizeof(uint16_t);
}

/* the weights of a layer's products */
static size_t layer_matmul_params(const net_layer *y) {
    const net_linear *p[] = {&y->qkv, &y->attn_out, &y->mlp_in, &y->mlp_out};
    size_t n = 0;
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) n += (size_t)p[i]->in * (size_t)p[i]->out;
    return n;
}

double dt_model_flops_per_token(const dt_model_cfg *c) {
    int n;
    size_t np;
    net_layer y0;
    lay_out(c, NULL, &n, &np, NULL, &y0, NULL, NULL);
    const double C = c->shape.n_embd, L = c->shape.n_layer, T = c->seq_len, A = y0.attn_out.in; /* A: NH * hs */
    double n_matmul = L * (double)layer_matmul_params(&y0);
    if (c->shape.num_labels == 0) n_matmul += (double)c->shape.vocab_size * C; /* LM head */
    return 6.0 * n_matmul + 12.0 * L * A * T;
}

/* ---- the activation table: every buffer forward and backward use, sized once ---- */

enum { BUF_ACT, BUF_F32, BUF_I32, BUF_BYTES }; /* the backend's activation element, float, int, bytes */
#define ARENA_ALIGN 256             /* every buffer starts on a 256-byte boundary */
#define MAX_BUFS(L) (14 * (size_t)(L) + 28)

typedef struct act_buf {
    void **at;   /* the model's pointer to it (NULL when only sizing) */
    int kind;    /* BUF_* */
    size_t n;    /* elements */
    int shared;  /* one for every activation set (scratch, and what lives longer than a micro-batch) */
} act_buf;

/* attention's shape for batches of B */
static const int packed_mark; /* a packed model's pos before it has a buffer: ops read only whether pos is NULL */
static dt_att_shape att_shape(const dt_model_cfg *c, int B) {
    const int tp = c->tp > 1 ? c->tp : 1; /* tensor parallelism: this share's heads */
    return (dt_att_shape){B, c->seq_len, c->shape.n_head / tp, dt_shape_kv_heads(&c->shape) / tp,
                          dt_shape_head_dim(&c->shape), c->packed ? &packed_mark : NULL};
}

/* the head's width: the classes, or the vocabulary (tensor parallelism: this share's part of it) */
static int head_width(const dt_model_cfg *c) {
    if (c->shape.num_labels) return c->shape.num_labels;
    return c->tp > 1 ? net_part_len(c->shape.vocab_size, c->tp, c->tp_rank) : c->shape.vocab_size;
}

/* a tensor-parallel language model: the cross-entropy is computed in shares (xent_part_*) */
static int xent_in_parts(const dt_model_cfg *c) { return c->tp > 1 && !c->shape.num_labels; }

/* The buffers of shape c, in arena order, into out (MAX_BUFS(L) entries); m NULL: sizes only.
 * y0: layer 0's products (the widths of qkv, attention's output and the MLP's two);
 * att, datt: the bytes attention keeps per layer and its backward scratch (ops attention_bytes);
 * logits_ld: the logits' row stride (ops logits_stride).
 * Returns how many. The allocation (dt_model_init) and the estimate (dt_model_memory_bytes)
 * both come from here, so they cannot drift apart. */
static int act_table(const dt_model_cfg *c, dt_model *m, const net_layer *y0, size_t att, size_t datt, int logits_ld,
                     act_buf *out) {
    const size_t B = (size_t)c->max_batch, T = (size_t)c->seq_len, C = (size_t)c->shape.n_embd, BT = B * T;
    const size_t NL = (size_t)c->shape.num_labels;
    const size_t head_rows = NL ? B : BT; /* classification: the pooled rows only */
    const size_t QKV = (size_t)y0->qkv.out, ATT = (size_t)y0->attn_out.in, PRE = (size_t)y0->mlp_in.out,
                 ACT = (size_t)y0->mlp_out.in;
    const net_arch *a = dt_net_arch(c->shape.arch);
    const size_t MEAN = a->norm == NET_LAYERNORM ? BT : 0, HMEAN = MEAN ? head_rows : 0; /* RMSNorm keeps rstd only */
    const size_t FREQ = a->rope ? (size_t)dt_shape_head_dim(&c->shape) / 2 : 0;
    const size_t LORA_H = (size_t)lora_per_layer(c) * (size_t)c->lora.rank; /* a row's x A^T, every adapter's */
    int lo, hi; /* pipeline parallelism: this stage's layers, and the head on the last stage only */
    dt_model_stage_layers(c, c->pp > 1 ? c->pp_rank : 0, &lo, &hi);
    const size_t H = c->pp <= 1 || c->pp_rank == c->pp - 1;
    int k = 0;
#define BUF(field, kind_, count) out[k++] = (act_buf){m ? (void **)&(m->field) : NULL, (kind_), (count), 0}
#define SHARED(field, kind_, count) out[k++] = (act_buf){m ? (void **)&(m->field) : NULL, (kind_), (count), 1}
    BUF(encoded, BUF_ACT, BT * C);
    for (int l = 0; l < c->shape.n_layer; l++) {
        const size_t y = l >= lo && l < hi; /* 0: another stage's layer, no room */
        BUF(layers[l].norm1, BUF_ACT, y * BT * C);
        BUF(layers[l].norm1_mean, BUF_F32, y * MEAN);
        BUF(layers[l].norm1_rstd, BUF_F32, y * BT);
        BUF(layers[l].qkv, BUF_ACT, y * BT * QKV);
        BUF(layers[l].atty, BUF_ACT, y * BT * ATT);
        BUF(layers[l].att, BUF_BYTES, y * att);
        BUF(layers[l].res2, BUF_ACT, y * BT * C);
        BUF(layers[l].norm2, BUF_ACT, y * BT * C);
        BUF(layers[l].norm2_mean, BUF_F32, y * MEAN);
        BUF(layers[l].norm2_rstd, BUF_F32, y * BT);
        BUF(layers[l].mlp_pre, BUF_ACT, y * BT * PRE);
        BUF(layers[l].mlp_act, BUF_ACT, y * BT * ACT);
        BUF(layers[l].res3, BUF_ACT, y * BT * C);
        BUF(layers[l].lora_h, BUF_F32, y * BT * LORA_H);
    }
    if (NL) {
        BUF(pooled_in, BUF_ACT, H * B * C);
        SHARED(dpooled, BUF_ACT, H * B * C);
        BUF(rows_dev, BUF_I32, H * B);
    }
    BUF(lnf, BUF_ACT, H * head_rows * C);
    BUF(lnf_mean, BUF_F32, H * HMEAN);
    BUF(lnf_rstd, BUF_F32, H * head_rows);
    BUF(logits, BUF_ACT, H * head_rows * (size_t)logits_ld);
    BUF(targets_dev, BUF_I32, head_rows);
    SHARED(losses, BUF_F32, H * BT);
    BUF(tokens_dev, BUF_I32, BT);
    BUF(pos_dev, BUF_I32, c->packed ? BT : 0); /* a set's: 1F1B's backward of a micro-batch follows later forwards */
    SHARED(argmax_dev, BUF_I32, H * BT);
    BUF(xent_stats, BUF_F32, xent_in_parts(c) ? H * 4 * BT : 0);
    BUF(xent_lse, BUF_F32, xent_in_parts(c) ? H * BT : 0);
    SHARED(d.dresidual, BUF_ACT, BT * C);
    SHARED(d.dnorm, BUF_ACT, BT * (ATT > C ? ATT : C));
    SHARED(d.dqkv, BUF_ACT, BT * QKV);
    SHARED(d.datt, BUF_BYTES, datt);
    SHARED(d.dpre, BUF_ACT, BT * PRE);
    SHARED(d.dact, BUF_ACT, BT * ACT);
    SHARED(net.inv_freq, BUF_F32, FREQ);
    SHARED(net.lora_h, BUF_F32, BT * (size_t)c->lora.rank);
    SHARED(loss_dev, BUF_BYTES, sizeof(double));
#undef SHARED
#undef BUF
    return k;
}

void dt_model_stage_layers(const dt_model_cfg *c, int stage, int *lo, int *hi) {
    size_t a = 0, b = (size_t)c->shape.n_layer;
    if (c->pp > 1) dt_comm_part((size_t)c->shape.n_layer, c->pp, stage, &a, &b);
    *lo = (int)a;
    *hi = (int)b;
}

static int act_sets(const dt_model_cfg *c) { return c->act_sets > 1 ? c->act_sets : 1; }

static size_t buf_bytes(const act_buf *b, dt_dtype act) {
    size_t bytes = b->n * (b->kind == BUF_ACT ? dt_dtype_size(act) : b->kind == BUF_BYTES ? 1 : 4);
    return (bytes + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
}

/* The arena's bytes for shape c on backend `ops` (ctx NULL: its estimate, ops.h attention_bytes),
 * with the table in `t` (MAX_BUFS entries) filled for m. */
static size_t table_bytes(const dt_model_cfg *c, dt_model *m, const net_layer *y0, const dt_ops *ops, void *ctx,
                          int bf16, act_buf *t, int *n) {
    const dt_dtype act = ops->act_dtype(bf16);
    size_t total = 0, att, datt;
    const dt_att_shape as = att_shape(c, c->max_batch);
    ops->attention_bytes(ctx, &as, bf16, &att, &datt);
    *n = act_table(c, m, y0, att, datt, ops->logits_stride(head_width(c)), t);
    for (int i = 0; i < *n; i++) total += buf_bytes(&t[i], act) * (t[i].shared ? 1 : (size_t)act_sets(c));
    return total;
}

size_t dt_model_memory_bytes(const dt_model_cfg *c, const dt_ops *ops, int bf16) {
    act_buf *t = malloc(MAX_BUFS(c->shape.n_layer) * sizeof *t);
    if (!t) return SIZE_MAX;
    int n;
    size_t np, nt, n16;
    net_layer y0;
    lay_out(c, NULL, &n, &np, &nt, &y0, &n16, NULL);
    size_t arena = table_bytes(c, NULL, &y0, ops, NULL, bf16, t, &n);
    free(t);
    /* parameters (model.lora.base_dtype bf16: the frozen matrices at 2 bytes), the trainable ones' gradients, activations */
    return (np - n16) * sizeof(float) + n16 * sizeof(uint16_t) + nt * sizeof(float) + arena;
}

void dt_model_op_sizes(const dt_model_cfg *c, dt_op_sizes *s) {
    const size_t B = (size_t)c->max_batch, T = (size_t)c->seq_len, BT = B * T;
    const size_t head_out = c->shape.num_labels ? B * (size_t)c->shape.num_labels : BT * (size_t)c->shape.vocab_size;
    int n;
    size_t np, n16;
    net_layer y0;
    lay_out(c, NULL, &n, &np, NULL, &y0, &n16, NULL);
    const net_linear *p[] = {&y0.qkv, &y0.attn_out, &y0.mlp_in, &y0.mlp_out};
    size_t in = 0, out = 0, w = 0;
    int bias = 0;
    for (size_t i = 0; i < sizeof p / sizeof *p; i++) {
        if ((size_t)p[i]->in > in) in = (size_t)p[i]->in;
        if ((size_t)p[i]->out > out) out = (size_t)p[i]->out;
        if ((size_t)p[i]->in * (size_t)p[i]->out > w) w = (size_t)p[i]->in * (size_t)p[i]->out;
        if (p[i]->b != NET_NONE && p[i]->out > bias) bias = p[i]->out;
    }
    const int base16 = c->lora.rank && c->lora.base_bf16, head16 = base16 && !c->shape.num_labels; /* a classifier's
                                                                                                   score trains */
    const size_t head_w = (size_t)head_width(c) * (size_t)c->shape.n_embd;
    memset(s, 0, sizeof *s);
    s->matmul_in = BT * in;                                     /* the widest product input (GPT-2: mlp.c_proj's) */
    s->matmul_out = head_out > BT * out ? head_out : BT * out;  /* the logits, or the widest output (mlp.c_fc's) */
    s->bias_rows = (int)BT;
    s->bias_cols = bias; /* the widest bias (GPT-2: mlp.c_fc.bias) */
    s->att = att_shape(c, c->max_batch);
    s->ln_rows = (int)BT;
    s->ln_width = c->shape.n_embd;
    s->enc_batch = c->max_batch;
    s->enc_seq = c->seq_len;
    s->enc_width = c->shape.n_embd;
    s->enc_vocab = c->shape.vocab_size;
    s->vector = np - n16; /* the float parameters (model.lora.base_dtype bf16: but the frozen matrices) */
    s->inputs = (c->packed ? 2 : 1) * BT * sizeof(int) + (c->shape.num_labels ? 2 * B : BT) * sizeof(int); /* tokens
                   (and their positions); rows and labels, or targets */
    s->head_rows = head_width(c);
    s->head_in = c->shape.n_embd;
    s->head_bf16 = head16;
    s->base16 = !base16 ? 0 : head16 && head_w > w ? head_w : w;
    s->lora_h = c->lora.rank ? BT * (size_t)c->lora.rank : 0; /* every adapted product's rows: the batch's tokens */
}

/* ---- init / free ---- */

static dt_status check_cfg(const dt_model_cfg *mc) {
    const dt_model_shape *c = &mc->shape;
    if (!dt_net_arch(c->arch)) return dt_error_set(DT_ERR_CONFIG, "model.type: no architecture %d", (int)c->arch);
    if (c->n_layer < 1) return dt_error_set(DT_ERR_CONFIG, "model.n_layer: expected >= 1, got %d", c->n_layer);
    if (c->n_head < 1) return dt_error_set(DT_ERR_CONFIG, "model.n_head: expected >= 1, got %d", c->n_head);
    if (c->n_embd < 1 || (c->n_embd % c->n_head && !(c->arch == DT_ARCH_LLAMA && c->head_dim > 0)))
        return dt_error_set(DT_ERR_CONFIG, "model.n_embd: expected a positive multiple of model.n_head (%d), got %d",
                            c->n_head, c->n_embd);
    if (c->arch == DT_ARCH_LLAMA) {
        const int nkv = dt_shape_kv_heads(c), hs = dt_shape_head_dim(c);
        if (nkv < 1 || c->n_head % nkv)
            return dt_error_set(DT_ERR_CONFIG, "model.num_key_value_heads: expected a divisor of model.n_head (%d), got %d",
                                c->n_head, nkv);
        if (hs < 2 || hs % 2 || hs > 1024)
            return dt_error_set(DT_ERR_CONFIG, "model.head_dim: expected an even head size <= 1024, got %d", hs);
        if (c->intermediate_size < 1)
            return dt_error_set(DT_ERR_CONFIG, "model.intermediate_size: expected >= 1, got %d", c->intermediate_size);
    }
    if (mc->lora.rank < 0 || (mc->lora.rank && (!mc->lora.targets || (mc->lora.targets & ~dt_lora_arch_targets(c->arch)) ||
                                                 !(mc->lora.alpha > 0))))
        return dt_error_set(DT_ERR_CONFIG, "model.lora: rank %d, alpha %g, targets 0x%x: expected rank >= 0, alpha > 0 "
                            "and targets of model.type %s", mc->lora.rank, mc->lora.alpha, mc->lora.targets,
                            dt_arch_name(c->arch));
    if (c->vocab_size < 2) return dt_error_set(DT_ERR_CONFIG, "model.vocab_size: expected >= 2, got %d", c->vocab_size);
    if (c->num_labels == 1 || c->num_labels < 0)
        return dt_error_set(DT_ERR_CONFIG, "model.num_labels: expected 0 or >= 2, got %d", c->num_labels);
    if (mc->seq_len < 1 || mc->seq_len > c->n_positions)
        return dt_error_set(DT_ERR_CONFIG, "data.seq_len: expected 1..model.n_positions (%d), got %d",
                            c->n_positions, mc->seq_len);
    if (mc->max_batch < 1)
        return dt_error_set(DT_ERR_CONFIG, "data.batch_size_per_worker: expected >= 1, got %d", mc->max_batch);
    if (mc->pp > 1 && (mc->pp_rank < 0 || mc->pp_rank >= mc->pp || mc->pp > c->n_layer))
        return dt_error_set(DT_ERR_CONFIG, "training.pipeline_parallel: stage %d of %d of %d layers: expected a stage "
                            "of the stages and at most one a layer", mc->pp_rank, mc->pp, c->n_layer);
    if (mc->tp > 1) { /* config.c refuses these by key; a caller that builds the model itself lands here */
        const int I = c->arch == DT_ARCH_LLAMA ? c->intermediate_size : 4 * c->n_embd;
        if (c->n_head % mc->tp || dt_shape_kv_heads(c) % mc->tp || I % mc->tp || c->vocab_size < mc->tp ||
            mc->tp_rank < 0 || mc->tp_rank >= mc->tp || !mc->tp_comm)
            return dt_error_set(DT_ERR_CONFIG, "training.tensor_parallel: %d shares (this one %d) of %d heads, %d "
                                "key/value heads, an MLP of %d and a vocabulary of %d: expected a divisor of the first "
                                "three, at most the last, and a collective of the shares", mc->tp,
                                mc->tp_rank, c->n_head, dt_shape_kv_heads(c), I, c->vocab_size);
    }
    return DT_OK;
}

/* the buckets from the tensors' bucket numbers: "embed", "h.0" .. "h.L-1", "head" */
static void build_buckets(dt_model *m) {
    const int L = m->cfg.shape.n_layer;
    m->n_buckets = L + 2;
    for (int b = 0; b < m->n_buckets; b++) {
        m->buckets[b].offset = (size_t)-1;
        m->buckets[b].numel = 0;
        if (b == 0) snprintf(m->bucket_names[b], sizeof m->bucket_names[b], "embed");
        else if (b == L + 1) snprintf(m->bucket_names[b], sizeof m->bucket_names[b], "head");
        else snprintf(m->bucket_names[b], sizeof m->bucket_names[b], "h.%d", b - 1);
        m->buckets[b].name = m->bucket_names[b];
    }
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        dt_bucket *b = &m->buckets[m->view[i].bucket];
        if (b->offset == (size_t)-1) b->offset = m->view[i].offset;
        b->numel += m->view[i].numel;
    }
    size_t end = 0; /* an empty bucket (model.lora's embeddings) sits where the one before ends */
    for (int b = 0; b < m->n_buckets; b++) {
        if (m->buckets[b].offset == (size_t)-1) m->buckets[b].offset = end;
        end = m->buckets[b].offset + m->buckets[b].numel;
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

/* ---- each tensor where it is kept (m->store), moved a part at a time ---- */

#define PART DT_ST_PART /* elements staged on the host at a time when weights are made, read, summed or written (4 MiB) */

/* elements [first, first + n) of tensor i = v (n floats; a bf16 tensor's rounded, to nearest even) */
static dt_status put_part(dt_model *m, int i, size_t first, size_t n, const float *v) {
    const size_t k = m->store[i];
    if (!net_is_bf16(k)) {
        m->be->ops->upload(m->be->ctx, m->net.params + k + first, v, n * sizeof(float));
        return DT_OK;
    }
    uint16_t *h = dt_malloc((n ? n : 1) * sizeof *h, "bf16 weights staging");
    if (!h) return DT_ERR_NOMEM;
    dt_bf16_pack(h, v, n);
    m->be->ops->upload(m->be->ctx, m->base16 + (k & ~NET_BF16) + first, h, n * sizeof *h);
    free(h);
    return DT_OK;
}

/* v (n floats) = elements [first, first + n) of tensor i */
static dt_status get_part(dt_model *m, int i, size_t first, size_t n, float *v) {
    const size_t k = m->store[i];
    if (!net_is_bf16(k)) {
        m->be->ops->download(m->be->ctx, v, m->net.params + k + first, n * sizeof(float));
        return DT_OK;
    }
    uint16_t *h = dt_malloc((n ? n : 1) * sizeof *h, "bf16 weights staging");
    if (!h) return DT_ERR_NOMEM;
    m->be->ops->download(m->be->ctx, h, m->base16 + (k & ~NET_BF16) + first, n * sizeof *h);
    dt_bf16_unpack(v, h, n);
    free(h);
    return DT_OK;
}

/* v (numel floats) = tensor i */
static dt_status get_tensor(dt_model *m, int i, float *v) { return get_part(m, i, 0, m->tensors[i].numel, v); }

/* ---- tensor parallelism: a tensor's share of its whole ---- */

/* the floats of share r of tensor t (tp shares) */
static size_t share_numel(const dt_tensor_info *t, int tp, int r) {
    if (t->split == DT_SPLIT_NONE || t->absent) return t->numel;
    const int rows = t->split == DT_SPLIT_ROWS;
    const size_t len = (size_t)t->sections * (size_t)net_part_len((rows ? t->whole[0] : t->whole[1]) / t->sections, tp, r);
    return len * (size_t)(rows ? t->whole[1] : t->whole[0]);
}

/* Elements [e0, e0 + n) of share r of split tensor t (tp shares), in the share's own order,
 * between `part` (n floats) and the whole tensor: the share is runs of the whole, a block's rows
 * (split by rows) or a row's columns of a block (by columns), run q of block s = q % S of row
 * q / S (rows split: one row of runs). */
static void share_copy(const dt_tensor_info *t, int tp, int r, float *whole, float *part, size_t e0, size_t n,
                       int to_part) {
    if (t->absent) return;
    const size_t C = (size_t)t->whole[1], S = (size_t)t->sections;
    const int rows = t->split == DT_SPLIT_ROWS;
    const int block = (int)((rows ? (size_t)t->whole[0] : C) / S);   /* a block's length along the split */
    const size_t lo = (size_t)net_part_lo(block, tp, r), len = (size_t)net_part_len(block, tp, r);
    const size_t unit = rows ? C : 1, run = len * unit;               /* floats a step along the split; a run */
    for (size_t e = e0; e < e0 + n;) {
        const size_t q = e / run, in = e % run, k = run - in < e0 + n - e ? run - in : e0 + n - e;
        float *w = whole + q / S * C + ((q % S) * (size_t)block + lo) * unit + in, *p = part + (e - e0);
        memcpy(to_part ? p : w, to_part ? w : p, k * sizeof(float));
        e += k;
    }
}

/* Tensor t's share `r` (of tp) and its whole, one from the other: local = share r of whole
 * (to_local), or share r's place in whole = local. The split dimension is t->sections blocks,
 * each cut in tp parts (net_part_lo); share r holds part r of every block, in block order. */
static void shard_copy(const dt_tensor_info *t, int tp, int r, float *whole, float *local, int to_local) {
    share_copy(t, tp, r, whole, local, 0, share_numel(t, tp, r), to_local);
}

static size_t whole_numel(const dt_tensor_info *t) { return (size_t)t->whole[0] * (size_t)t->whole[1]; }

/* tensor i = this share of `whole` (whole numel floats) */
static dt_status put_share(dt_model *m, int i, float *whole) {
    const dt_tensor_info *t = &m->tensors[i];
    if (t->absent) return DT_OK;
    if (t->split == DT_SPLIT_NONE) return put_part(m, i, 0, t->numel, whole);
    float *mine = dt_malloc(t->numel * sizeof(float), "tensor-parallel share");
    if (!mine) return DT_ERR_NOMEM;
    shard_copy(t, m->cfg.tp, m->cfg.tp_rank, whole, mine, 1);
    dt_status st = put_part(m, i, 0, t->numel, mine);
    free(mine);
    return st;
}

/* a tensor this model holds only part of, or none (tensor, pipeline parallelism) */
static int partial(const dt_tensor_info *t) { return t->split != DT_SPLIT_NONE || t->absent; }

/* Every tensor as the architecture says it starts, in layout order from one normal stream. A
 * tensor-parallel share (a pipeline stage) draws every tensor whole and keeps its share (its
 * own): the same weights as one worker's. */
static dt_status init_weights(dt_model *m) {
    size_t most = PART;
    for (int i = 0; i < m->n_tensors; i++)
        if (partial(&m->tensors[i]) && whole_numel(&m->tensors[i]) > most) most = whole_numel(&m->tensors[i]);
    float *p = dt_malloc(most * sizeof(float), "initial weights");
    if (!p) return DT_ERR_NOMEM;
    rng_t r = {m->cfg.seed, 0, 0.0};
    dt_status st = DT_OK;
    for (int k = 0; st == DT_OK && k < m->n_tensors; k++) { /* in layout order: the trainable ones' moving leaves the stream as it was */
        const int i = m->seq[k];
        const dt_tensor_info *t = &m->tensors[i];
        const double std = m->init_std[i];
        const int split = partial(t);
        const size_t numel = split ? whole_numel(t) : t->numel, step = split ? numel : PART;
        for (size_t j0 = 0; st == DT_OK && j0 < numel; j0 += step) {
            const size_t n = numel - j0 < step ? numel - j0 : step;
            for (size_t j = 0; j < n; j++)
                p[j] = m->init[i] == NET_INIT_NORMAL    ? (float)(std * rng_normal(&r))
                       : m->init[i] == NET_INIT_UNIFORM ? (float)(std * (2.0 * (double)(rng_u64(&r) >> 11) / 9007199254740992.0 - 1.0))
                       : m->init[i] == NET_INIT_ONE     ? 1.0f
                                                        : 0.0f;
            st = split ? put_share(m, i, p) : put_part(m, i, j0, n, p);
        }
    }
    free(p);
    return st;
}

void dt_model_free(dt_model *m) {
    if (!m) return;
    const dt_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    if (m->net.params) o->set_master(ctx, NULL, 0);
    o->free(ctx, m->net.params);
    o->free(ctx, m->base16);
    o->free(ctx, m->net.grads);
    o->free(ctx, m->arena);
    free(m->act_tab);
    free(m->act_off);
    free(m->held);
    o->free_host(ctx, m->loss_host);
    free(m->layers);
    free(m->net.w.layers);
    if (m->view != m->tensors) free(m->view);
    free(m->tensors);
    free(m->store);
    free(m->seq);
    free(m->init);
    free(m->init_std);
    free(m->buckets);
    free(m->bucket_names);
    free(m->host_losses);
    free(m->host_argmax);
    free(m->host_rows);
    free(m->host_probs);
    free(m->host_probs_f);
    free(m->host_stats);
    free(m);
}

void dt_model_use_acts(dt_model *m, int k) {
    m->set = k;
    char *set = (char *)m->arena + m->shared_bytes + (size_t)k * m->set_bytes;
    for (int i = 0; i < m->n_act_tab; i++)
        *m->act_tab[i].at = (m->act_tab[i].shared ? (char *)m->arena : set) + m->act_off[i];
    if (m->cfg.packed) m->net.att.pos = m->pos_dev; /* the set's positions (dt_model_set_positions) */
}

/* One allocation for every activation: the shared buffers, then each set of the others; the
 * table's pointers into set 0. */
static dt_status alloc_arena(dt_model *m) {
    const int L = m->cfg.shape.n_layer;
    m->act_tab = dt_malloc(MAX_BUFS(L) * sizeof *m->act_tab, "activation table");
    m->act_off = dt_malloc(MAX_BUFS(L) * sizeof *m->act_off, "activation table");
    if (!m->act_tab || !m->act_off) return DT_ERR_NOMEM;
    const dt_ops *o = m->be->ops;
    act_buf *t = m->act_tab;
    const size_t total = table_bytes(&m->cfg, m, &m->net.w.layers[0], o, m->be->ctx, o->bf16(m->be->ctx), t,
                                     &m->n_act_tab);
    for (int i = 0; i < m->n_act_tab; i++) {
        size_t *at = t[i].shared ? &m->shared_bytes : &m->set_bytes;
        m->act_off[i] = *at;
        *at += buf_bytes(&t[i], m->net.act);
    }
    char what[128];
    snprintf(what, sizeof what, "the activations of batch %d (%.1f MiB%s)", m->cfg.max_batch, (double)total / (1 << 20),
             act_sets(&m->cfg) > 1 ? ", for the micro-batches in flight" : "");
    DT_TRY(m->be->ops->alloc(m->be->ctx, total, what, &m->arena));
    if (!(m->held = dt_calloc((size_t)act_sets(&m->cfg), sizeof *m->held, "what the logits hold")))
        return DT_ERR_NOMEM;
    dt_model_use_acts(m, 0);
    return DT_OK;
}

/* Where each tensor is kept (m->store): the frozen matrices in base16 with model.lora.base_dtype
 * bf16, the others in params, each in layout order; and the named offsets moved there. */
static dt_status place_tensors(dt_model *m) {
    const int n = m->n_tensors;
    if (!(m->store = dt_malloc((size_t)n * sizeof *m->store, "tensor places"))) return DT_ERR_NOMEM;
    size_t f = 0, h = 0, h_numel = 0;
    for (int i = 0; i < n; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        const int half = m->n_base16 && i < m->n_frozen_tensors && t->ndim == 2;
        if (half) h = (h + 7) & ~(size_t)7; /* each bf16 matrix 16-byte aligned, as cuBLASLt's fast kernels want */
        m->store[i] = half ? NET_BF16 | h : f;
        *(half ? &h : &f) += t->numel;
        if (half) h_numel += t->numel;
        /* the output head (not another stage's tensor at its offset): zero rows to the logits' stride (ops.h
           head_bf16) */
        if (half && !t->absent && !m->cfg.shape.num_labels && t->offset == m->net.w.head.w)
            h += (size_t)(m->logits_ld - t->shape[0]) * (size_t)t->shape[1];
        if (i + 1 == m->n_frozen_tensors) m->net.frozen = f;
    }
    if (!m->n_frozen_tensors) m->net.frozen = 0;
    m->n_store = f;
    if (h_numel != m->n_base16)
        return dt_error_set(DT_ERR_INTERNAL, "model: %zu bf16 parameters laid out, %zu counted", h_numel, m->n_base16);
    m->n_base16 = h; /* with the alignment's gaps and the head's padding (zeros: the allocation's) */
    if (!m->n_base16) return DT_OK; /* every place its offset */
    size_t *from = dt_malloc((size_t)n * sizeof *from, "tensor places");
    if (!from) return DT_ERR_NOMEM;
    for (int i = 0; i < n; i++) from[i] = m->tensors[i].offset;
    remap_weights(&m->net.w, m->cfg.shape.n_layer, &(remap){from, m->store, m->tensors, n});
    free(from);
    return DT_OK;
}

/* The host tables: tensors (laid out), buckets, layers, staging. */
static dt_status alloc_tables(dt_model *m) {
    const dt_model_cfg *cfg = &m->cfg;
    const size_t B = (size_t)cfg->max_batch, T = (size_t)cfg->seq_len, L = (size_t)cfg->shape.n_layer, BT = B * T;
    int n;
    size_t np;
    lay_out(cfg, NULL, &n, &np, NULL, NULL, NULL, NULL);
    m->seq = dt_calloc((size_t)n, sizeof *m->seq, "tensor order");
    m->tensors = dt_calloc((size_t)n, sizeof *m->tensors, "tensor table");
    m->init = dt_calloc((size_t)n, sizeof *m->init, "tensor inits");
    m->init_std = dt_calloc((size_t)n, sizeof *m->init_std, "tensor inits");
    m->net.w.layers = dt_calloc(L, sizeof *m->net.w.layers, "layer tensors");
    m->buckets = dt_calloc(L + 2, sizeof *m->buckets, "bucket table");
    m->bucket_names = dt_calloc(L + 2, sizeof *m->bucket_names, "bucket names");
    m->layers = dt_calloc(L, sizeof *m->layers, "layer activations");
    m->host_losses = dt_malloc(BT * sizeof(float), "loss staging");
    m->host_argmax = dt_malloc(BT * sizeof(int), "prediction staging");
    m->host_rows = dt_malloc(B * sizeof(int), "row staging");
    const size_t NLB = B * (size_t)(cfg->shape.num_labels ? cfg->shape.num_labels : 1);
    m->host_probs = dt_malloc((cfg->shape.num_labels ? B * (size_t)m->logits_ld : 1) * sizeof(float), "probability staging");
    m->host_probs_f = dt_malloc(NLB * sizeof(float), "probabilities");
    if (xent_in_parts(cfg) && !(m->host_stats = dt_malloc(((size_t)cfg->tp + 1) * BT * 4 * sizeof(float) +
                                                          BT * sizeof(float), "cross-entropy shares")))
        return DT_ERR_NOMEM;
    if (!m->seq || !m->tensors || !m->init || !m->init_std || !m->net.w.layers || !m->buckets || !m->bucket_names || !m->layers ||
        !m->host_losses || !m->host_argmax || !m->host_rows || !m->host_probs || !m->host_probs_f)
        return DT_ERR_NOMEM;
    DT_TRY(lay_out(cfg, m, &m->n_tensors, &m->n_params, NULL, NULL, &m->n_base16, NULL));
    DT_TRY(place_tensors(m));
    m->view = m->tensors;
    if (cfg->lora.rank) {
        const int nv = m->n_tensors - m->n_frozen_tensors;
        if (!(m->view = dt_calloc((size_t)nv, sizeof *m->view, "trainable tensors"))) return DT_ERR_NOMEM;
        for (int i = 0; i < nv; i++) {
            m->view[i] = m->tensors[m->n_frozen_tensors + i];
            m->view[i].offset -= m->n_frozen;
        }
    }
    const int nv = m->n_tensors - m->n_frozen_tensors;
    for (int i = 0; i < nv; i++) { /* the whole tensors one after the other (tensor parallelism) */
        m->view[i].whole_offset = m->n_whole;
        m->n_whole += (size_t)m->view[i].whole[0] * (size_t)m->view[i].whole[1];
    }
    build_buckets(m);
    return DT_OK;
}

/* The ops the architecture needs beyond every backend's (ops.h: they may be NULL). */
static dt_status check_backend(const net_arch *a, const dt_ops *o) {
    const int rms = a->norm != NET_RMSNORM || (o->rmsnorm_fwd && o->rmsnorm_bwd);
    const int rope = !a->rope || (o->rope_fwd && o->rope_bwd), glu = a->mlp != NET_SWIGLU || (o->swiglu_fwd && o->swiglu_bwd);
    if (rms && rope && glu) return DT_OK;
    return dt_error_set(DT_ERR_CONFIG, "model.type: the %s backend has no %s yet, which model.type %s needs (hint: "
                        "training.device: cpu)", o->name, !rms ? "RMSNorm" : !rope ? "rotary positions" : "SwiGLU",
                        dt_arch_name(a->id));
}

/* Llama 3.1's scaling of one frequency (transformers' rope_type "llama3", its float32 steps):
 * wavelengths longer than original / low_freq_factor are stretched by factor, shorter than
 * original / high_freq_factor kept, those between interpolated. */
static float llama3_freq(float inv, const dt_model_shape *s) {
    const double orig = s->rope_original_max_position_embeddings, factor = s->rope_scaling_factor;
    const double lo = s->rope_low_freq_factor, hi = s->rope_high_freq_factor;
    const float wavelen = (1.0f / inv) * (float)(2.0 * M_PI); /* 2 pi / t is t.reciprocal() * 2 pi */
    const float lo_wavelen = (float)(orig / lo), hi_wavelen = (float)(orig / hi);
    if (wavelen > lo_wavelen) return inv / (float)factor;
    if (wavelen < hi_wavelen) return inv;
    const float smooth = ((1.0f / wavelen) * (float)orig - (float)lo) / (float)(hi - lo);
    const float a = (1.0f - smooth) * inv, b = smooth * inv;
    return a / (float)factor + b;
}

/* RoPE's frequencies, as transformers computes them: inv_freq[i] = 1 / theta^(2i / hs) in
 * float (rope type "default"), then scaled as Llama 3.1's when model.rope_scaling.factor > 0 */
static void rope_freqs(dt_model *m) {
    const dt_model_shape *s = &m->cfg.shape;
    const int hs = dt_shape_head_dim(s), half = hs / 2;
    float f[512];
    for (int i = 0; i < half; i++) {
        f[i] = 1.0f / powf((float)s->rope_theta, (float)(2 * i) / (float)hs);
        if (s->rope_scaling_factor > 0) f[i] = llama3_freq(f[i], s);
    }
    m->be->ops->upload(m->be->ctx, m->net.inv_freq, f, (size_t)half * sizeof(float));
}

dt_status dt_model_init(dt_model **out, const dt_model_cfg *cfg, const dt_backend *be) {
    *out = NULL;
    DT_TRY(check_cfg(cfg));
    DT_TRY(check_backend(dt_net_arch(cfg->shape.arch), be->ops));
    const dt_ops *bo = be->ops;
    if (cfg->tp > 1 && !(bo->encoder_part_fwd && bo->encoder_part_bwd && bo->xent_part_stats && bo->xent_part_bwd))
        return dt_error_set(DT_ERR_CONFIG, "training.tensor_parallel: the %s backend cannot split the vocabulary yet "
                            "(hint: training.device: cpu)", bo->name);
    if (cfg->lora.rank && !(be->ops->lora_fwd && be->ops->lora_bwd))
        return dt_error_set(DT_ERR_CONFIG, "model.lora: the %s backend has no LoRA adapters yet (hint: "
                            "training.device: cpu, or model.lora.rank: 0)", be->ops->name);
    if (cfg->lora.rank && cfg->lora.base_bf16 &&
        (!be->ops->matmul16_fwd || !be->ops->matmul16_bwd || !be->ops->encoder16_fwd ||
         (be->ops->memory && !be->ops->bf16(be->ctx))))
        return dt_error_set(DT_ERR_CONFIG, "model.lora.base_dtype: bf16 needs products of bf16 weights, which the %s "
                            "backend %s (hint: model.lora.base_dtype: fp32%s)", be->ops->name,
                            be->ops->matmul16_fwd ? "has only with bf16 products" : "does not have yet",
                            be->ops->matmul16_fwd ? ", or training.precision: bf16" : "");
    dt_status st = DT_ERR_NOMEM;
    dt_model *m = dt_calloc(1, sizeof *m, "model");
    if (!m) return DT_ERR_NOMEM;
    m->cfg = *cfg;
    m->be = be;
    m->T = cfg->seq_len;
    m->net = (dt_net){.o = be->ops, .ctx = be->ctx, .cfg = &m->cfg, .arch = dt_net_arch(cfg->shape.arch),
                      .act = be->ops->act_dtype(be->ops->bf16(be->ctx)), .att = att_shape(cfg, 0),
                      .tp = cfg->tp > 1 ? cfg->tp : 1, .tp_rank = cfg->tp_rank, .tp_comm = cfg->tp_comm, .tp_st = &m->tp_st, .tp_ms = &m->tp_ms,
                      .v0 = cfg->tp > 1 ? net_part_lo(cfg->shape.vocab_size, cfg->tp, cfg->tp_rank) : 0,
                      .n_vocab = cfg->tp > 1 ? net_part_len(cfg->shape.vocab_size, cfg->tp, cfg->tp_rank)
                                             : cfg->shape.vocab_size};
    m->logits_ld = be->ops->logits_stride(head_width(cfg));
    if ((st = alloc_tables(m)) != DT_OK) goto fail;

    const dt_ops *o = be->ops;
    if (cfg->lora.rank) {
        m->net.lora_rank = cfg->lora.rank;
        m->net.lora_scale = (float)(cfg->lora.alpha / cfg->lora.rank);
    }
    if ((st = o->alloc(be->ctx, m->n_store * sizeof(float), "parameters", (void **)&m->net.params)) != DT_OK ||
        (st = o->alloc(be->ctx, (m->n_store - m->net.frozen) * sizeof(float), "gradients", (void **)&m->net.grads)) !=
            DT_OK)
        goto fail;
    if (m->n_base16) { /* model.lora.base_dtype bf16 */
        dt_op_sizes sizes;
        dt_model_op_sizes(cfg, &sizes);
        if ((st = o->alloc(be->ctx, m->n_base16 * sizeof(uint16_t), "the frozen bf16 weights", (void **)&m->base16)) !=
                DT_OK ||
            (st = o->reserve(be->ctx, &sizes)) != DT_OK) /* the pieces the products widen it in, before any product */
            goto fail;
        m->net.base16 = m->base16;
    }
    o->set_master(be->ctx, m->net.params, m->n_store);
    if ((st = o->alloc_host(be->ctx, sizeof(double), "the training loss", (void **)&m->loss_host)) != DT_OK) goto fail;
    if ((st = alloc_arena(m)) != DT_OK || (st = init_weights(m)) != DT_OK) goto fail;
    if (m->net.arch->rope) rope_freqs(m);
    if (cfg->packed) m->net.att.pos = m->pos_dev;
    *out = m;
    return DT_OK;
fail:
    dt_model_free(m);
    return st;
}

const dt_model_cfg *dt_model_config(const dt_model *m) { return &m->cfg; }
const dt_backend *dt_model_backend(const dt_model *m) { return m->be; }
const dt_net *dt_model_net(const dt_model *m) { return &m->net; }
size_t dt_model_num_params(const dt_model *m) { return m->n_params - m->n_frozen; }
size_t dt_model_whole_params(const dt_model *m) { return m->n_whole; }
double dt_model_tp_ms(const dt_model *m) { return m->tp_ms; }
size_t dt_model_num_frozen(const dt_model *m) { return m->n_frozen; }

/* Tensor parallelism: the CRC-32 of split tensor t (tensor i) whole, without moving its data. A
 * share's part is, in its own order, runs of the whole (shard_copy): a block's rows (split by
 * rows), or a row's columns of a block (by columns). Each share hashes its runs (the tensor read
 * PART floats at a time into v), one all-gather brings every share's, and they are combined in
 * the whole's order: block by block (row by row, then block by block), share by share. */
static dt_status split_crc(dt_model *m, int i, float *v, uLong *crc) {
    const dt_tensor_info *t = &m->tensors[i];
    const int tp = m->cfg.tp, rows = t->split == DT_SPLIT_ROWS;
    const size_t R = (size_t)t->whole[0], C = (size_t)t->whole[1], S = (size_t)t->sections;
    const int block = (int)((rows ? R : C) / S);
    const size_t unit = rows ? C : 1, runs = rows ? S : R * S, mine_len = (size_t)net_part_len(block, tp, m->cfg.tp_rank);
    uint32_t *all = dt_malloc(((size_t)tp + 1) * runs * sizeof *all, "digests of the shares");
    if (!all) return DT_ERR_NOMEM; /* the other shares fail at the deadline */
    uint32_t *mine = all + (size_t)tp * runs;
    dt_status st = DT_OK;
    size_t run = 0, left = mine_len * unit; /* floats left in the current run */
    uLong c = crc32_z(0L, Z_NULL, 0);
    for (size_t j0 = 0; st == DT_OK && j0 < t->numel; j0 += PART) {
        const size_t n = t->numel - j0 < PART ? t->numel - j0 : PART;
        if ((st = get_part(m, i, j0, n, v)) != DT_OK) break;
        for (size_t k = 0; k < n;) { /* the chunk's pieces of runs */
            const size_t take = n - k < left ? n - k : left;
            c = crc32_z(c, (const Bytef *)(v + k), take * sizeof(float));
            k += take;
            if ((left -= take) == 0) {
                mine[run++] = (uint32_t)c;
                c = crc32_z(0L, Z_NULL, 0);
                left = mine_len * unit;
            }
        }
    }
    if (st == DT_OK && run != runs)
        st = dt_error_set(DT_ERR_INTERNAL, "model: %s: %zu runs of its share hashed, %zu expected", t->name, run, runs);
    if (st == DT_OK) st = dt_comm_allgather(m->cfg.tp_comm, mine, runs * sizeof *mine, all);
    for (size_t k = 0; st == DT_OK && k < runs; k++) /* the whole's order: run k of every share in turn */
        for (int r = 0; r < tp; r++)
            *crc = crc32_combine(*crc, all[(size_t)r * runs + k],
                                 (z_off_t)((size_t)net_part_len(block, tp, r) * unit * sizeof(float)));
    free(all);
    return st;
}

/* The CRC-32 of the frozen tensors (as floats, in offset order) that stage `stage` owns (-1:
 * all of them), and their bytes. Tensor parallelism: of the whole tensors (split_crc; every
 * share calls it). */
static dt_status frozen_crc(dt_model *m, int stage, uint32_t *crc_out, uint64_t *bytes) {
    float *v = dt_malloc(PART * sizeof(float), "frozen weights");
    dt_status st = v ? DT_OK : DT_ERR_NOMEM; /* the other shares fail at the deadline */
    uLong crc = crc32_z(0L, Z_NULL, 0);
    uint64_t len = 0;
    for (int i = 0; st == DT_OK && i < m->n_frozen_tensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        if (stage >= 0 && !dt_net_stage_owns(&m->cfg, stage, t->bucket)) continue; /* the tied head's copy */
        len += whole_numel(t) * sizeof(float);
        if (m->cfg.tp > 1 && t->split != DT_SPLIT_NONE) {
            st = split_crc(m, i, v, &crc);
            continue;
        }
        for (size_t j0 = 0; st == DT_OK && j0 < t->numel; j0 += PART) {
            const size_t n = t->numel - j0 < PART ? t->numel - j0 : PART;
            if ((st = get_part(m, i, j0, n, v)) == DT_OK) crc = crc32_z(crc, (const Bytef *)v, n * sizeof(float));
        }
    }
    free(v);
    DT_TRY(st);
    DT_TRY(m->be->ops->check(m->be->ctx));
    *crc_out = (uint32_t)crc;
    *bytes = len;
    return DT_OK;
}

/* the digest of the whole base without stages (tensor-parallel shares: every share calls it), kept */
static dt_status whole_digest(dt_model *m, uint32_t *out) {
    uint64_t bytes;
    DT_TRY(frozen_crc(m, -1, out, &bytes));
    m->base_digest = *out;
    m->base_digest_ok = 1;
    return DT_OK;
}

dt_status dt_model_frozen_digest(dt_model *m, uint32_t *out) {
    if (m->base_digest_ok) {
        *out = m->base_digest;
        return DT_OK;
    }
    if (m->cfg.pp > 1 || m->cfg.tp > 1) /* a stage or a share holds part of the base */
        return dt_error_set(DT_ERR_INTERNAL, "model: the frozen weights' digest of a pipeline stage or tensor-parallel "
                            "share needs the others' (dt_model_frozen_digest_stages)");
    return whole_digest(m, out);
}

dt_status dt_model_frozen_digest_stages(dt_model *m, dt_comm *all, uint32_t *out) {
    if (m->base_digest_ok) return dt_model_frozen_digest(m, out);
    if (m->cfg.pp <= 1) return whole_digest(m, out);
    const int world = dt_comm_world(all);
    uint64_t mine[3] = {(uint64_t)m->cfg.pp_rank, 0, 0}, *every = dt_malloc((size_t)world * sizeof mine, "digests");
    uint32_t crc = 0;
    dt_status st = every ? frozen_crc(m, m->cfg.pp_rank, &crc, &mine[2]) : DT_ERR_NOMEM; /* the others fail at the deadline */
    mine[1] = crc;
    if (st == DT_OK) st = dt_comm_allgather(all, mine, sizeof mine, every);
    uLong whole = crc32_z(0L, Z_NULL, 0); /* the CRC of the stages' parts one after the other, as one run */
    for (int p = 0; st == DT_OK && p < m->cfg.pp; p++) {
        int k = 0;
        while (k < world && every[3 * k] != (uint64_t)p) k++;
        if (k == world) st = dt_error_set(DT_ERR_INTERNAL, "model: no rank reported stage %d's frozen weights", p);
        else whole = crc32_combine(whole, (uLong)every[3 * k + 1], (z_off_t)every[3 * k + 2]);
    }
    free(every);
    DT_TRY(st);
    *out = m->base_digest = (uint32_t)whole;
    m->base_digest_ok = 1;
    return DT_OK;
}
int dt_model_num_tensors(const dt_model *m) { return m->n_tensors - m->n_frozen_tensors; }
const dt_tensor_info *dt_model_tensor(const dt_model *m, int i) { return &m->view[i]; }
int dt_model_num_buckets(const dt_model *m) { return m->n_buckets; }
const dt_bucket *dt_model_bucket(const dt_model *m, int i) { return &m->buckets[i]; }
float *dt_model_params(dt_model *m) { return m->net.params + m->net.frozen; }
float *dt_model_grads(dt_model *m) { return m->net.grads; }

void dt_model_params_changed(dt_model *m) { m->be->ops->set_master(m->be->ctx, m->net.params, m->n_store); }

void dt_model_zero_grad(dt_model *m) {
    m->be->ops->zero(m->be->ctx, m->net.grads, (m->n_store - m->net.frozen) * sizeof(float));
}

/* ---- forward ---- */

/* The head's cross-entropy over `rows` rows of logits: the losses and, for training on a backend
 * that fuses it, the logits' gradient in place in the same pass (no probabilities; backward
 * uses it as it is); else the probabilities in place; and the predictions when asked. Which
 * of the two the logits hold is kept per set of activations (m->held): a pipeline stage's
 * micro-batches in flight may each run their forward before any backward. */
static void head_xent(dt_model *m, int rows, int predict, float scale) {
    const dt_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    const int V = head_width(&m->cfg), ld = m->logits_ld;
    struct logits_held *h = &m->held[m->set];
    h->grads = !predict && o->xent_fused;
    h->scale = scale;
    if (h->grads) o->xent_fused(ctx, m->losses, m->logits, m->logits, m->targets_dev, scale, rows, V, ld);
    else o->xent_fwd(ctx, m->losses, m->logits, m->logits, m->targets_dev, rows, V, ld);
    if (predict) o->argmax(ctx, m->argmax_dev, m->logits, rows, V, ld);
}

dt_status dt_model_set_length(dt_model *m, int T) {
    if (T < 1 || T > m->cfg.seq_len || (m->cfg.pp > 1 && T != m->cfg.seq_len))
        return dt_error_set(DT_ERR_INTERNAL, "model length: %d outside 1..%d%s", T, m->cfg.seq_len,
                            m->cfg.pp > 1 ? " (pipeline stages: rows of seq_len only)" : "");
    m->T = T;
    return DT_OK;
}

int dt_model_length(const dt_model *m) { return m->T; }

int dt_model_rows_length(const dt_model *m, const int *tokens, const int *targets, int B) {
    const int S = m->cfg.seq_len, NL = m->cfg.shape.num_labels;
    int len = 1;
    for (int b = 0; b < B; b++)
        for (int t = S - 1; t >= len; t--) /* a row's last position that counts */
            if (NL ? tokens[(size_t)b * S + t] != m->cfg.pad_id : targets[(size_t)b * S + t] >= 0) {
                len = t + 1;
                break;
            }
    return len;
}

/* the n rows of S ints of a (n, S) array (NULL: none) moved to rows of T <= S, in place */
static void cut_rows(int *a, int n, int S, int T) {
    for (int i = 1; a && i < n; i++) memmove(a + (size_t)i * T, a + (size_t)i * S, (size_t)T * sizeof(int));
}

dt_status dt_model_cut_rows(dt_model *m, int *tokens, int *targets, int *pos, int B) {
    const int S = m->cfg.seq_len;
    int T = S;
    if (m->be->ops->short_rows && m->cfg.pp <= 1) {
        const int step = (S + 7) / 8 < 8 ? 8 : ((S + 7) / 8 + 7) / 8 * 8;
        T = (dt_model_rows_length(m, tokens, targets, B) + step - 1) / step * step;
        if (T > S) T = S;
        cut_rows(tokens, B, S, T);
        cut_rows(m->cfg.shape.num_labels ? NULL : targets, B, S, T);
        cut_rows(pos, B, S, T);
    }
    return dt_model_set_length(m, T);
}

dt_status dt_model_set_positions(dt_model *m, const int *pos, int B) {
    const int T = m->T;
    if (!m->cfg.packed) return dt_error_set(DT_ERR_INTERNAL, "model positions: the model's rows are not packed");
    if (B < 1 || B > m->cfg.max_batch)
        return dt_error_set(DT_ERR_INTERNAL, "model positions: batch %d outside 1..%d", B, m->cfg.max_batch);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const int p = pos[(size_t)b * T + t];
            if (p != 0 && (t == 0 || p != pos[(size_t)b * T + t - 1] + 1))
                return dt_error_set(DT_ERR_INTERNAL, "model positions: row %d position %d is %d, expected 0%s", b, t, p,
                                    t ? " or the one before + 1" : "");
        }
    m->be->ops->upload_async(m->be->ctx, m->pos_dev, pos, (size_t)B * T * sizeof(int));
    m->pos_B = B;
    return DT_OK;
}

/* The inputs checked and queued for upload (upload_async: the caller's arrays may be rewritten
 * at once), before any work is queued. */
static dt_status upload_inputs(dt_model *m, const int *tokens, const int *targets, int B) {
    const dt_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    const int T = m->T, V = m->cfg.shape.vocab_size, NL = m->cfg.shape.num_labels, BT = B * T;
    if (B < 1 || B > m->cfg.max_batch)
        return dt_error_set(DT_ERR_INTERNAL, "model forward: batch %d outside 1..%d", B, m->cfg.max_batch);
    if (m->cfg.packed && m->pos_B != B)
        return dt_error_set(DT_ERR_INTERNAL, "model forward: batch %d, but the packed rows' positions are for %d", B,
                            m->pos_B);
    for (int i = 0; i < BT; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return dt_error_set(DT_ERR_DATA, "token %d at position %d is outside the vocabulary [0, %d) (hint: model.vocab_size)",
                                tokens[i], i, V);
    o->upload_async(ctx, m->tokens_dev, tokens, (size_t)BT * sizeof(int));
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
        o->upload_async(ctx, m->rows_dev, m->host_rows, (size_t)B * sizeof(int));
        o->upload_async(ctx, m->targets_dev, targets, (size_t)B * sizeof(int));
    } else {
        o->upload_async(ctx, m->targets_dev, targets, (size_t)BT * sizeof(int));
    }
    return DT_OK;
}

/* The classifier's head over the last layer's output x: the pooled rows, the final norm, the
 * score product and the cross-entropy; the results downloaded into res (res NULL: training, the
 * loss added to the device's sum, nothing downloaded). */
static void classifier_head(dt_model *m, const dt_act *x, const int *targets, int B, int predict, float scale,
                            dt_fwd_result *res) {
    const dt_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    const int C = m->cfg.shape.n_embd, NL = m->cfg.shape.num_labels, ld = m->logits_ld;
    o->gather_rows(ctx, m->pooled_in, x, m->rows_dev, B, C);
    dt_net_norm_fwd(&m->net, &m->net.w.final_norm, m->lnf, m->lnf_mean, m->lnf_rstd, m->pooled_in, B);
    dt_net_mm_fwd(&m->net, &m->net.w.head, m->logits, m->lnf, B, ld, NULL, NULL);
    head_xent(m, B, predict, scale);
    if (!res) {
        o->loss_sum(ctx, m->loss_dev, m->losses, NULL, B); /* every label is one (upload_inputs) */
        return;
    }
    o->download(ctx, m->host_losses, m->losses, (size_t)B * sizeof(float));
    if (predict) o->download(ctx, m->host_argmax, m->argmax_dev, (size_t)B * sizeof(int));
    const int grads = m->held[m->set].grads;
    if (!grads) o->download(ctx, m->host_probs, m->logits, (size_t)B * ld * dt_dtype_size(m->net.act));
    for (int b = 0; b < B; b++) {
        if (predict) res->correct += m->host_argmax[b] == targets[b];
        res->loss_sum += m->host_losses[b];
    }
    for (size_t b = 0; !grads && b < (size_t)B; b++)
        for (size_t j = 0; j < (size_t)NL; j++) {
            const size_t i = b * (size_t)ld + j;
            m->host_probs_f[b * (size_t)NL + j] = m->net.act == DT_DTYPE_F32
                                                      ? ((const float *)m->host_probs)[i]
                                                      : dt_bf16_to_float(((const uint16_t *)m->host_probs)[i]);
        }
    res->rows = B;
    res->pred = predict ? m->host_argmax : NULL;
    res->probs = grads ? NULL : m->host_probs_f;
    res->losses = m->host_losses;
}

/* Tensor parallelism: the cross-entropy of the whole rows from every share's part of the logits
 * (the vocabulary split): each share's xent_part_stats all-gathered and combined on the host,
 * in share order (the same bits on every share), into the losses (backend and host_losses), the
 * log-sum-exp backward reads (xent_lse) and the predictions (host_argmax). targets: host. */
static void xent_shares(dt_model *m, const int *targets, int BT) {
    const dt_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    const int tp = m->cfg.tp;
    float *all = m->host_stats, *mine = all + (size_t)tp * BT * 4, *lse = mine + (size_t)BT * 4;
    o->xent_part_stats(ctx, m->xent_stats, m->logits, m->targets_dev, m->net.v0, BT, m->net.n_vocab, m->logits_ld);
    o->download(ctx, mine, m->xent_stats, (size_t)BT * 4 * sizeof(float));
    const double t0 = dt_clock_now();
    if (m->tp_st == DT_OK) m->tp_st = dt_comm_allgather(m->cfg.tp_comm, mine, (size_t)BT * 4 * sizeof(float), all);
    m->tp_ms += 1e3 * (dt_clock_now() - t0);
    if (m->tp_st != DT_OK) return;
    for (int i = 0; i < BT; i++) {
        const float *st = all + (size_t)i * 4;
        const size_t stride = (size_t)BT * 4; /* from one share's stats to the next's */
        int best = 0;
        for (int t = 1; t < tp; t++)
            if (st[t * stride] > st[best * stride]) best = t;
        const double M = st[best * stride];
        double S = 0, X = 0;
        for (int t = 0; t < tp; t++) {
            S += (double)st[t * stride + 1] * exp((double)st[t * stride] - M);
            X += st[t * stride + 2];
        }
        lse[i] = (float)(M + log(S));
        m->host_losses[i] = targets[i] >= 0 ? (float)(M + log(S) - X) : 0.0f;
        m->host_argmax[i] = (int)st[best * stride + 3];
    }
    o->upload(ctx, m->losses, m->host_losses, (size_t)BT * sizeof(float));
    o->upload(ctx, m->xent_lse, lse, (size_t)BT * sizeof(float));
}

/* The language model's head over every row of x: the final norm, the output head, the
 * cross-entropy; the results downloaded into res (res NULL: as for classifier_head). */
static void lm_head(dt_model *m, const dt_act *x, const int *targets, int BT, int predict, float scale,
                    dt_fwd_result *res) {
    const dt_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    dt_net_norm_fwd(&m->net, &m->net.w.final_norm, m->lnf, m->lnf_mean, m->lnf_rstd, x, BT);
    dt_net_mm_fwd(&m->net, &m->net.w.head, m->logits, m->lnf, BT, m->logits_ld, NULL, NULL);
    if (xent_in_parts(&m->cfg)) xent_shares(m, targets, BT);
    else head_xent(m, BT, predict, scale);
    if (!res) {
        o->loss_sum(ctx, m->loss_dev, m->losses, m->targets_dev, BT); /* the rows with a target */
        return;
    }
    if (!xent_in_parts(&m->cfg)) {
        o->download(ctx, m->host_losses, m->losses, (size_t)BT * sizeof(float));
        if (predict) o->download(ctx, m->host_argmax, m->argmax_dev, (size_t)BT * sizeof(int));
    }
    for (int i = 0; i < BT; i++) {
        if (targets[i] < 0) continue;
        if (predict) res->correct += m->host_argmax[i] == targets[i];
        res->loss_sum += m->host_losses[i];
        res->rows++;
    }
    res->pred = predict ? m->host_argmax : NULL;
}

static int first_stage(const dt_model *m) { return m->cfg.pp <= 1 || m->cfg.pp_rank == 0; }
static int last_stage(const dt_model *m) { return m->cfg.pp <= 1 || m->cfg.pp_rank == m->cfg.pp - 1; }

/* Pipeline parallelism: a stage but the first reads its input from `encoded` (the caller's), a
 * stage but the last ends at its last layer (res all 0) */
static dt_status forward(dt_model *m, const int *tokens, const int *targets, int B, dt_fwd_result *res, int predict,
                         float scale) {
    DT_TRY(upload_inputs(m, tokens, targets, B));
    const int T = m->T;
    const net_span span = {.B = B, .T = T, .pos0 = -1};
    if (first_stage(m)) dt_net_embed(&m->net, m->encoded, m->tokens_dev, B, T, -1);
    const dt_act *x = m->encoded;
    int lo, hi;
    dt_model_stage_layers(&m->cfg, m->cfg.pp_rank, &lo, &hi);
    for (int l = lo; l < hi; l++) {
        dt_net_layer_fwd(&m->net, l, &m->layers[l], x, &span);
        x = m->layers[l].res3;
    }
    if (res) memset(res, 0, sizeof *res);
    if (last_stage(m) && m->cfg.shape.num_labels) classifier_head(m, x, targets, B, predict, scale, res);
    else if (last_stage(m)) lm_head(m, x, targets, B * T, predict, scale, res);
    m->last_B = B;
    m->last_T = T;
    if (m->tp_st != DT_OK) return m->tp_st;
    return res ? m->be->ops->check(m->be->ctx) : DT_OK; /* training: the step's check reports a failure */
}

dt_status dt_model_forward(dt_model *m, const int *tokens, const int *targets, int B, dt_fwd_result *res) {
    return forward(m, tokens, targets, B, res, 1, 0.0f);
}

dt_status dt_model_forward_loss(dt_model *m, const int *tokens, const int *targets, int B, float scale,
                                dt_fwd_result *res) {
    return forward(m, tokens, targets, B, res, 0, scale);
}

dt_status dt_model_forward_train(dt_model *m, const int *tokens, const int *targets, int B, float scale, long *rows) {
    const int BT = B * m->T;
    long n = m->cfg.shape.num_labels ? B : 0;
    for (int i = 0; !m->cfg.shape.num_labels && i < BT; i++) n += targets[i] >= 0; /* as lm_head counts them */
    DT_TRY(forward(m, tokens, targets, B, NULL, 0, scale));
    *rows = n;
    return DT_OK;
}

void dt_model_loss_fetch(dt_model *m) {
    const dt_ops *o = m->be->ops;
    o->download_async(m->be->ctx, m->loss_host, m->loss_dev, sizeof(double));
    o->zero(m->be->ctx, m->loss_dev, sizeof(double)); /* after the copy, in the backend's order */
}

double dt_model_loss_fetched(const dt_model *m) { return *m->loss_host; }

/* ---- backward ---- */

/* The head backward: its parameters' gradients, and the last layer's output gradient into
 * dresidual (zeroed first). */
static dt_status head_bwd(dt_model *m, int B, float scale) {
    const dt_ops *o = m->be->ops;
    void *ctx = m->be->ctx;
    const int T = m->last_T, C = m->cfg.shape.n_embd, NL = m->cfg.shape.num_labels, BT = B * T;
    const size_t asz = dt_dtype_size(m->net.act);
    const net_weights *w = &m->net.w;
    o->zero(ctx, m->d.dresidual, (size_t)BT * C * asz);
    struct logits_held *h = &m->held[m->set];
    if (h->grads && scale != h->scale)
        return dt_error_set(DT_ERR_INTERNAL, "model backward: scale %g, but the forward computed the gradient for %g",
                            (double)scale, (double)h->scale);
    const int head_rows = NL ? B : BT;
    if (xent_in_parts(&m->cfg))
        o->xent_part_bwd(ctx, m->logits, m->logits, m->xent_lse, m->targets_dev, m->net.v0, scale, BT, m->net.n_vocab,
                         m->logits_ld);
    else if (!h->grads)
        o->xent_bwd(ctx, m->logits, m->logits, m->targets_dev, scale, head_rows, head_width(&m->cfg), m->logits_ld);
    h->grads = 0;
    dt_net_mm_bwd(&m->net, &w->head, m->d.dnorm, m->logits, m->lnf, head_rows, m->logits_ld, NULL, NULL, NULL);
    if (NL) {
        o->zero(ctx, m->dpooled, (size_t)B * C * asz);
        dt_net_norm_bwd(&m->net, &w->final_norm, m->dpooled, m->d.dnorm, m->pooled_in, m->lnf_mean, m->lnf_rstd, B);
        o->scatter_add_rows(ctx, m->d.dresidual, m->dpooled, m->rows_dev, B, C);
    } else {
        const dt_act *xL = m->layers[m->cfg.shape.n_layer - 1].res3;
        dt_net_norm_bwd(&m->net, &w->final_norm, m->d.dresidual, m->d.dnorm, xL, m->lnf_mean, m->lnf_rstd, BT);
    }
    return DT_OK;
}

/* Pipeline parallelism: a stage but the last starts from the gradient in d.dresidual (the
 * caller's), a stage but the first leaves its input's there; every bucket is reported, another
 * stage's empty. */
dt_status dt_model_backward(dt_model *m, float scale, dt_bucket_ready_fn ready, void *user) {
    const int B = m->last_B, T = m->last_T, L = m->cfg.shape.n_layer;
    if (B == 0) return dt_error_set(DT_ERR_INTERNAL, "model backward called without a forward");
    if (last_stage(m)) DT_TRY(head_bwd(m, B, scale));
    if (ready) ready(user, L + 1);
    int lo, hi;
    dt_model_stage_layers(&m->cfg, m->cfg.pp_rank, &lo, &hi);
    for (int l = L - 1; l >= 0; l--) {
        if (l >= lo && l < hi)
            dt_net_layer_bwd(&m->net, l, &m->layers[l], l == lo ? m->encoded : m->layers[l - 1].res3, &m->d, B, T);
        if (ready) ready(user, 1 + l);
    }
    if (first_stage(m)) dt_net_embed_bwd(&m->net, m->d.dresidual, m->tokens_dev, B, T);
    if (ready) ready(user, 0);
    return m->tp_st;
}

float *dt_model_stage_input(dt_model *m) { return (float *)m->encoded; }
float *dt_model_stage_grad(dt_model *m) { return (float *)m->d.dresidual; }
static size_t stage_bytes(const dt_model_cfg *c, dt_dtype act, int B) {
    return (size_t)B * (size_t)c->seq_len * (size_t)c->shape.n_embd * dt_dtype_size(act);
}
size_t dt_model_stage_bytes(const dt_model *m, int B) { return stage_bytes(&m->cfg, m->net.act, B); }
size_t dt_model_stage_bytes_cfg(const dt_model_cfg *c, const dt_ops *ops, int bf16, int B) {
    return stage_bytes(c, ops->act_dtype(bf16), B);
}
float *dt_model_stage_output(dt_model *m) {
    int lo, hi;
    dt_model_stage_layers(&m->cfg, m->cfg.pp_rank, &lo, &hi);
    return (float *)m->layers[hi - 1].res3;
}

int dt_model_tied_head(const dt_model_cfg *cfg) { return dt_net_tied_head(cfg); }

void dt_model_set_tp_comm(dt_model *m, dt_comm *c) {
    m->cfg.tp_comm = c;
    m->net.tp_comm = c;
}

void dt_model_tied_grad(const dt_model *m, size_t *offset, size_t *n) {
    *offset = *n = 0;
    if (m->cfg.pp <= 1 || !dt_net_tied_head(&m->cfg) || !(first_stage(m) || last_stage(m))) return;
    if (!dt_net_grad(&m->net, m->net.w.wte)) return; /* model.lora: the embedding frozen, no gradient to sum */
    for (int i = 0; i < dt_model_num_tensors(m); i++) /* view offsets: in the trainable parameters */
        if (m->view[i].offset == m->net.w.wte - m->n_frozen && !m->view[i].absent) {
            *offset = m->view[i].offset;
            *n = m->view[i].numel;
        }
}

void dt_model_stage_range(const dt_model *m, int stage, size_t *lo, size_t *hi) {
    *lo = SIZE_MAX;
    *hi = 0;
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_tensor_info *t = &m->view[i];
        if (!dt_net_stage_owns(&m->cfg, stage, t->bucket)) continue;
        if (t->whole_offset < *lo) *lo = t->whole_offset;
        if (t->whole_offset + whole_numel(t) > *hi) *hi = t->whole_offset + whole_numel(t);
    }
    if (*lo > *hi) *lo = *hi;
}

/* ---- weights I/O ---- */

dt_status dt_model_gather_whole(dt_model *m, float *whole) {
    return dt_model_gather_range(m, NULL, NULL, whole, 0, m->n_whole);
}

/* floats [off, off + n) of this share's array into dst: read's, or with read NULL the parameters */
static dt_status share_read(dt_model *m, dt_model_read_fn read, void *user, size_t off, size_t n, float *dst) {
    if (read) return read(user, off, n, dst);
    m->be->ops->download(m->be->ctx, dst, dt_model_params(m) + off, n * sizeof(float));
    return DT_OK;
}

/* Each split tensor is all-gathered a window of at most PART floats of its largest share at a
 * time (every share sends its window, zeros past its end), and each share's part of the window
 * copied to its place in `whole`: what this costs beside `whole` is tp + 1 windows, whatever the
 * model's size (each tensor all-gathered whole took tp + 1 times the largest share, ~151 MB at
 * SmolLM2's embedding with tensor_parallel 3, beside a host copy of the share's whole array). */
dt_status dt_model_gather_range(dt_model *m, dt_model_read_fn read, void *user, float *whole, size_t base,
                                size_t count) {
    const int tp = m->cfg.tp > 1 ? m->cfg.tp : 1;
    size_t win = 1; /* a window: the largest share of a split tensor, at most PART floats */
    for (int i = 0; i < dt_model_num_tensors(m); i++)
        for (int r = 0; r < tp && m->view[i].split != DT_SPLIT_NONE; r++) {
            const size_t k = share_numel(&m->view[i], tp, r);
            if ((k < PART ? k : PART) > win) win = k < PART ? k : PART;
        }
    float *all = tp > 1 ? dt_malloc((size_t)(tp + 1) * win * sizeof(float), "tensor-parallel shares") : NULL;
    dt_status st = tp == 1 || all ? DT_OK : DT_ERR_NOMEM; /* the others fail at the deadline */
    for (int i = 0; st == DT_OK && i < dt_model_num_tensors(m); i++) { /* in order, every share alike */
        const dt_tensor_info *t = &m->view[i];
        if (t->absent) continue; /* another stage's */
        const int in = whole && t->whole_offset >= base && t->whole_offset + whole_numel(t) <= base + count;
        float *dst = in ? whole + (t->whole_offset - base) : NULL; /* NULL: not wanted here */
        if (t->split == DT_SPLIT_NONE) {
            if (dst) st = share_read(m, read, user, t->offset, t->numel, dst);
            continue;
        }
        size_t most = 0; /* the shares may differ by a row */
        for (int r = 0; r < tp; r++)
            if (share_numel(t, tp, r) > most) most = share_numel(t, tp, r);
        float *pad = all + (size_t)tp * win; /* this share's window */
        for (size_t e0 = 0; st == DT_OK && e0 < most; e0 += win) {
            const size_t k = most - e0 < win ? most - e0 : win, mine = t->numel > e0 ? t->numel - e0 : 0;
            const size_t have = mine < k ? mine : k;
            if (have) st = share_read(m, read, user, t->offset + e0, have, pad);
            if (st == DT_OK) st = m->be->ops->check(m->be->ctx); /* a failed device sends nothing: the */
            if (st != DT_OK) break;                              /* others fail at the deadline */
            memset(pad + have, 0, (k - have) * sizeof(float));
            st = dt_comm_allgather(m->cfg.tp_comm, pad, k * sizeof(float), all);
            for (int r = 0; st == DT_OK && dst && r < tp; r++) {
                const size_t n_r = share_numel(t, tp, r);
                if (e0 < n_r) share_copy(t, tp, r, dst, all + (size_t)r * k, e0, n_r - e0 < k ? n_r - e0 : k, 0);
            }
        }
    }
    free(all);
    return st == DT_OK ? m->be->ops->check(m->be->ctx) : st; /* the tensors read whole into `whole` */
}

void dt_model_tensor_share(const dt_model *m, int i, const float *whole, float *local) {
    const dt_tensor_info *t = &m->view[i];
    if (t->split == DT_SPLIT_NONE) memcpy(local, whole, t->numel * sizeof(float));
    else shard_copy(t, m->cfg.tp, m->cfg.tp_rank, (float *)whole, local, 1);
}


/* A weights file's metadata into keys and vals (4 entries each; *n of them): its format and
 * producer, and with adapters (model.lora's trainable tensors) the digest (written into digest,
 * 16 chars) and the dtype of the base they apply to. */
static dt_status file_meta(dt_model *m, int adapters, const char **keys, const char **vals, char *digest, int *n) {
    uint32_t d;
    keys[0] = "format", vals[0] = "pt";
    keys[1] = "producer", vals[1] = "dtrain";
    *n = 2;
    if (!adapters) return DT_OK;
    DT_TRY(dt_model_frozen_digest(m, &d));
    snprintf(digest, 16, "%08x", d);
    keys[2] = "lora_base_digest", vals[2] = digest;
    keys[3] = "lora_base_dtype", vals[3] = m->cfg.lora.base_bf16 ? "bf16" : "fp32";
    *n = 4;
    return DT_OK;
}

/* dt_st_write_parts's fill: elements [first, first + n) of (whole) tensor i, read from where it is kept
 * (a model in one piece: the view's tensors are the whole ones) */
static dt_status fill_param_part(void *user, int i, size_t first, size_t n, float *buf) {
    dt_model *m = user;
    DT_TRY(share_read(m, NULL, NULL, m->view[i].offset + first, n, buf));
    return m->be->ops->check(m->be->ctx); /* a device that failed must not leave a well-checksummed file of garbage */
}

/* whether the model's trainable tensors are all here, whole: no tensor parallelism, no other stage's */
static int held_whole(const dt_model *m) {
    if (m->cfg.tp > 1) return 0;
    for (int i = 0; i < dt_model_num_tensors(m); i++)
        if (m->view[i].absent) return 0;
    return 1;
}

/* The view's tensors, whole, into the file `path`, named outer + prefix + name (score.weight:
 * outer + name): from `whole` (dt_model_whole_params floats, host), or with whole NULL (a model
 * in one piece, held_whole) read from the backend a part at a time. */
static dt_status write_whole(dt_model *m, const float *whole, const char *path, const char *outer, const char *prefix) {
    const int nt = dt_model_num_tensors(m);
    dt_st_entry *e = dt_calloc((size_t)nt, sizeof *e, "tensor list");
    char(*names)[128] = dt_calloc((size_t)nt, sizeof *names, "tensor names");
    if (!e || !names) {
        free(e);
        free(names);
        return DT_ERR_NOMEM;
    }
    for (int i = 0; i < nt; i++) {
        const dt_tensor_info *t = &m->view[i];
        snprintf(names[i], sizeof names[i], "%s%s%s", outer, strcmp(t->name, "score.weight") ? prefix : "", t->name);
        e[i] = (dt_st_entry){.name = names[i], .ndim = t->ndim, .shape = {t->whole[0], t->whole[1]},
                             .data = whole ? whole + t->whole_offset : NULL};
    }
    const char *keys[4], *vals[4];
    char digest[16];
    int nk = 0;
    dt_status st = m->be->ops->check(m->be->ctx);
    if (st == DT_OK) st = file_meta(m, m->cfg.lora.rank > 0, keys, vals, digest, &nk);
    if (st == DT_OK) st = dt_st_write_parts(path, e, nt, keys, vals, nk, whole ? NULL : fill_param_part, m);
    free(e);
    free(names);
    return st;
}

dt_status dt_model_save_whole(dt_model *m, const float *whole, const char *path) {
    return write_whole(m, whole, path, "", "");
}

static void shape_str(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++) k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

/* model.lora: tensor i is an adapter (trainable, not the score head) */
static int is_adapter(const dt_model *m, int i) {
    return m->cfg.lora.rank && i >= m->n_frozen_tensors && strcmp(m->tensors[i].name, "score.weight") != 0;
}

/* the offset in the parameters' layout (dt_tensor_info) of the tensor kept at `store` */
static size_t layout_offset(const dt_model *m, size_t store) {
    for (int i = 0; i < m->n_tensors; i++)
        if (m->store[i] == store) return m->tensors[i].offset;
    return NET_NONE;
}

/* Each adapter's scale B A added onto the columns of the product it adapts, in host (the
 * parameters' layout): W + scale (B A)^T for GPT-2's (in, out) storage, W + scale B A for (out, in). */
static void merge_adapters(const dt_model *m, float *host) {
    const int r = m->cfg.lora.rank;
    const double sc = m->cfg.lora.alpha / r;
    for (int l = 0; l < m->cfg.shape.n_layer; l++) {
        const net_layer *y = &m->net.w.layers[l];
        const net_linear *lins[] = {&y->qkv, &y->attn_out, &y->mlp_in, &y->mlp_out};
        for (int q = 0; q < 4; q++) {
            const net_linear *lin = lins[q];
            float *w = host + layout_offset(m, lin->w);
            for (int i = 0; i < lin->n_lora; i++) {
                const net_lora *ad = &lin->lora[i];
                const float *A = host + layout_offset(m, ad->a), *B = host + layout_offset(m, ad->b);
                for (int j = 0; j < ad->cols; j++)
                    for (int k = 0; k < lin->in; k++) {
                        double d = 0;
                        for (int t = 0; t < r; t++) d += (double)B[(size_t)j * r + t] * A[(size_t)t * lin->in + k];
                        float *x = lin->trans ? &w[(size_t)(ad->col0 + j) * lin->in + k] : &w[(size_t)k * lin->out + ad->col0 + j];
                        *x += (float)(sc * d);
                    }
            }
        }
    }
}

/* The save of a model without adapters: the whole tensors (a tensor-parallel share's gathered from
 * every share, each calling it), written by share 0 alone. */
static dt_status save_whole(dt_model *m, const char *path, const char *outer, const char *prefix) {
    if (held_whole(m)) return write_whole(m, NULL, path, outer, prefix); /* no staging of the whole model */
    float *whole = m->cfg.tp_rank == 0 ? dt_malloc(m->n_whole * sizeof(float), "weights staging") : NULL;
    dt_status st = dt_model_gather_whole(m, whole); /* with the others even without the staging */
    if (st == DT_OK && m->cfg.tp_rank == 0 && !whole) st = DT_ERR_NOMEM;
    if (st == DT_OK && m->cfg.tp_rank == 0) st = write_whole(m, whole, path, outer, prefix);
    free(whole);
    return st;
}

/* The tensors `which` names (SAVE_ALL every one, SAVE_TRAINABLE model.lora's trainable ones,
 * SAVE_MERGED the architecture's with the adapters merged in) into the file `path`, named
 * outer + prefix + name (score.weight: outer + name). The first two are the model's view, whole
 * (tensor parallelism: gathered from the shares, every share calling). */
enum { SAVE_ALL, SAVE_TRAINABLE, SAVE_MERGED };
static dt_status save_tensors(dt_model *m, const char *path, const char *outer, const char *prefix, int which) {
    if (which != SAVE_MERGED) return save_whole(m, path, outer, prefix);
    if (m->cfg.tp > 1 || m->cfg.pp > 1) /* export's model is whole */
        return dt_error_set(DT_ERR_INTERNAL, "model: merged adapters of a model in shares or stages");
    float *host = dt_malloc((m->n_params ? m->n_params : 1) * sizeof(float), "weights staging");
    dt_st_entry *e = dt_calloc((size_t)m->n_tensors, sizeof *e, "tensor list");
    const int renamed = outer[0] || prefix[0];
    char(*names)[128] = renamed ? dt_calloc((size_t)m->n_tensors, sizeof *names, "tensor names") : NULL;
    dt_status st = DT_ERR_NOMEM;
    int n = 0;
    if (host && e && (names || !renamed)) {
        st = DT_OK;
        for (int i = 0; st == DT_OK && i < m->n_tensors; i++) st = get_tensor(m, i, host + m->tensors[i].offset);
        if (st == DT_OK) merge_adapters(m, host);
        for (int i = 0; st == DT_OK && i < m->n_tensors; i++) {
            if (is_adapter(m, i)) continue;
            const dt_tensor_info *t = &m->tensors[i];
            e[n].name = t->name;
            if (names) {
                snprintf(names[n], sizeof names[n], "%s%s%s", outer, strcmp(t->name, "score.weight") ? prefix : "",
                         t->name);
                e[n].name = names[n];
            }
            e[n].ndim = t->ndim;
            e[n].shape[0] = t->shape[0];
            e[n].shape[1] = t->shape[1];
            e[n].data = host + t->offset;
            n++;
        }
        const char *keys[4], *vals[4];
        char digest[16];
        int nk = 0;
        /* a device that failed earlier must not leave a well-checksummed file of garbage */
        if (st == DT_OK && (st = m->be->ops->check(m->be->ctx)) == DT_OK)
            st = file_meta(m, 0, keys, vals, digest, &nk);
        if (st == DT_OK) st = dt_st_write(path, e, n, keys, vals, nk);
    }
    free(host);
    free(e);
    free(names);
    return st;
}

dt_status dt_model_save(dt_model *m, const char *path) {
    return save_tensors(m, path, "", "", m->cfg.lora.rank ? SAVE_TRAINABLE : SAVE_ALL);
}
dt_status dt_model_save_hf(dt_model *m, const char *path) {
    return save_tensors(m, path, "", m->net.arch->hf_prefix, m->cfg.lora.rank ? SAVE_MERGED : SAVE_ALL);
}
dt_status dt_model_save_peft(dt_model *m, const char *path) {
    if (!m->cfg.lora.rank) return dt_error_set(DT_ERR_INTERNAL, "model: PEFT adapters of a model without model.lora");
    return save_tensors(m, path, "base_model.model.", m->net.arch->hf_prefix, SAVE_TRAINABLE);
}

/* Maps a file tensor name to ours: strips the architecture's prefix ("transformer."); returns
 * NULL for names to ignore (buffers that are not weights). */
static const char *canonical_name(const net_arch *a, const char *name) {
    static const char peft[] = "base_model.model."; /* PEFT's adapters (model.lora.init_from) */
    if (strncmp(name, peft, sizeof peft - 1) == 0) name += sizeof peft - 1;
    const size_t np = strlen(a->hf_prefix);
    if (np && strncmp(name, a->hf_prefix, np) == 0) name += np;
    const size_t n = strlen(name);
    for (const char *const *s = a->ignored_suffixes; **s; s++) {
        const size_t k = strlen(*s);
        if (n > k && strcmp(name + n - k, *s) == 0) return NULL;
    }
    return name;
}

/* NaN and Inf in a tensor read in parts (dt_finite_tally): how many, and the first (its element
 * and value); dt_finite_add adds v[0..n), the tensor's elements base.. */
int dt_finite_add(dt_finite_tally *t, const float *v, size_t n, size_t base) {
    /* the common case at memory speed: an exponent of all ones (NaN or Inf) anywhere? */
    const uint32_t *bits = (const uint32_t *)(const void *)v;
    uint32_t any = 0;
    for (size_t i = 0; i < n; i++) any |= (bits[i] & 0x7f800000u) == 0x7f800000u;
    if (!any) return 0;
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i]) && t->bad++ == 0) t->first = base + i, t->value = v[i];
    return 1;
}

dt_status dt_finite_verdict(const dt_finite_tally *t, const char *path, const char *name) {
    if (!t->bad) return DT_OK;
    return dt_error_set(DT_ERR_DATA, "%s: tensor %s holds %s at element %zu (%zu value%s NaN or Inf): not usable weights",
                        path, name, isnan(t->value) ? "NaN" : t->value > 0 ? "+Inf" : "-Inf", t->first, t->bad,
                        t->bad == 1 ? " is" : "s are");
}

dt_status dt_check_finite(const float *v, size_t n, const char *path, const char *name) {
    dt_finite_tally t = {0, 0, 0.0f};
    dt_finite_add(&t, v, n, 0);
    return dt_finite_verdict(&t, path, name);
}

/* Tensor j of the model from the file's tensor t, PART elements at a time: each part
 * checked finite (a NaN or Inf anywhere: refused naming the first and how many) and put in
 * place. lm: the file's copy of the output head when the model ties it to this tensor (the
 * token embedding): it must hold the same values (GPT-2 files that store it do); an untied head
 * is refused rather than silently dropped. v: 2 PART floats of scratch. */
static dt_status load_tensor(dt_model *m, dt_st_file *f, int j, const dt_st_tensor *t, const dt_st_tensor *lm, float *v,
                             const char *path) {
    const size_t numel = m->tensors[j].numel;
    if (m->tensors[j].absent) return DT_OK; /* another stage's: it reads and checks it */
    if (m->tensors[j].split != DT_SPLIT_NONE) { /* a tensor-parallel share: read whole, keep the share */
        float *whole = dt_malloc(whole_numel(&m->tensors[j]) * sizeof(float), "weights staging");
        if (!whole) return DT_ERR_NOMEM;
        dt_finite_tally bad = {0, 0, 0.0f};
        dt_status st = dt_st_read_f32_part(f, t, 0, whole_numel(&m->tensors[j]), whole);
        if (st == DT_OK) dt_finite_add(&bad, whole, whole_numel(&m->tensors[j]), 0);
        for (size_t i0 = 0; st == DT_OK && lm && !bad.bad && i0 < whole_numel(&m->tensors[j]); i0 += PART) {
            const size_t k = whole_numel(&m->tensors[j]) - i0 < PART ? whole_numel(&m->tensors[j]) - i0 : PART;
            st = dt_st_read_f32_part(f, lm, i0, k, v); /* the tied head's copy must equal the embedding */
            size_t i = 0;
            while (st == DT_OK && i < k && v[i] == whole[i0 + i]) i++;
            if (st == DT_OK && i < k)
                st = dt_error_set(DT_ERR_DATA, "%s: tensor %s differs from %s (first at element %zu): an untied "
                                               "output head, which dtrain cannot represent (its head is the token "
                                               "embedding)", path, lm->name, m->tensors[j].name, i0 + i);
        }
        if (st == DT_OK && !bad.bad) st = put_share(m, j, whole);
        free(whole);
        return st == DT_OK ? dt_finite_verdict(&bad, path, t->name) : st;
    }
    float *w = v + PART;
    dt_finite_tally bad = {0, 0, 0.0f};
    for (size_t i0 = 0; i0 < numel; i0 += PART) {
        const size_t k = numel - i0 < PART ? numel - i0 : PART;
        DT_TRY(dt_st_read_f32_part(f, t, i0, k, v));
        if (dt_finite_add(&bad, v, k, i0) || bad.bad) continue; /* counted to the end, then refused */
        if (lm) {
            DT_TRY(dt_st_read_f32_part(f, lm, i0, k, w));
            size_t i = 0;
            while (i < k && w[i] == v[i]) i++;
            if (i < k)
                return dt_error_set(DT_ERR_DATA, "%s: tensor %s differs from %s (first at element %zu): an untied "
                                                 "output head, which dtrain cannot represent (its head is the token "
                                                 "embedding)", path, lm->name, m->tensors[j].name, i0 + i);
        }
        DT_TRY(put_part(m, j, i0, k, v));
    }
    return dt_finite_verdict(&bad, path, t->name);
}

/* A hint with the config values the file implies (read as the architecture names them). */
static void file_shape_hint(const net_arch *a, const dt_st_file *f, char *buf, size_t n) {
    int64_t V = -1, P = -1, C = -1, L = 0, NL = -1;
    const size_t lp = strlen(a->layer_prefix);
    for (int i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        const char *nm = canonical_name(a, t->name);
        if (!nm) continue;
        if (strcmp(nm, a->embed_name) == 0 && t->ndim == 2) { V = t->shape[0]; C = t->shape[1]; }
        else if (a->positions_name && strcmp(nm, a->positions_name) == 0 && t->ndim == 2) P = t->shape[0];
        else if (strcmp(nm, "score.weight") == 0 && t->ndim == 2) NL = t->shape[0];
        else if (strncmp(nm, a->layer_prefix, lp) == 0) {
            long l = strtol(nm + lp, NULL, 10);
            if (l + 1 > L) L = l + 1;
        }
    }
    size_t k = (size_t)snprintf(buf, n, "the file has model.vocab_size %lld", (long long)V);
    if (a->positions_name && k < n) k += (size_t)snprintf(buf + k, n - k, ", n_positions %lld", (long long)P);
    if (k < n) k += (size_t)snprintf(buf + k, n - k, ", n_embd %lld, n_layer %lld", (long long)C, (long long)L);
    if (NL > 0 && k < n) snprintf(buf + k, n - k, ", num_labels %lld", (long long)NL);
}

/* dt_model_load; only_adapters: a file without LoRA adapters is refused rather than taken as
 * the frozen model's weights (dt_model_load_adapters). Every name and shape is checked before
 * any tensor is read; each is then read, checked finite and put in place one at a time. */
static dt_status load_weights(dt_model *m, const char *path, int *score_loaded, int only_adapters) {
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(&f, path));
    dt_status st = DT_OK;
    char hint[256], a[64], b[64];
    const dt_st_tensor **from = dt_calloc((size_t)m->n_tensors, sizeof *from, "tensor list"); /* each one's file tensor */
    float *v = dt_malloc(2 * PART * sizeof(float), "weights staging");
    if (!from || !v) { st = DT_ERR_NOMEM; goto done; }
    file_shape_hint(m->net.arch, f, hint, sizeof hint);
    /* model.lora: a file of adapters (dt_model_save's) fills the trainable tensors, any other the frozen model */
    int adapters = 0;
    for (int i = 0; m->cfg.lora.rank && i < dt_st_count(f); i++) {
        const char *nm = dt_st_tensor_at(f, i)->name;
        const size_t k = strlen(nm);
        adapters |= k > 14 && strcmp(nm + k - 14, ".lora_A.weight") == 0;
    }
#define IN_SET(j) (adapters ? (j) >= m->n_frozen_tensors : !is_adapter(m, (j)))
    if (only_adapters && !adapters) {
        st = dt_error_set(DT_ERR_DATA, "%s holds no LoRA adapters (no tensor named *.lora_A.weight)%s", path,
                          m->cfg.lora.rank ? ": expected a PEFT adapter directory or a model.lora run's weights"
                                           : ", and the model has none (model.lora.rank 0)");
        goto done;
    }
    const char *want = adapters ? dt_st_metadata(f, "lora_base_digest") : NULL;
    uint32_t have;
    /* Model parallelism: no digest of the base yet, so the base is what is being loaded (model.init_from) */
    if (want && !m->base_digest_ok && (m->cfg.tp > 1 || m->cfg.pp > 1)) {
        st = dt_error_set(DT_ERR_DATA, "%s holds LoRA adapters (trained on a base of digest %s), not a model: "
                          "adapters load after their base (hint: model.init_from must name the base they were "
                          "trained on, and model.lora.init_from the adapters)", path, want);
        goto done;
    }
    if (want && (st = dt_model_frozen_digest(m, &have)) != DT_OK) goto done;
    if (want && strtoul(want, NULL, 16) != have) {
        const char *dt = dt_st_metadata(f, "lora_base_dtype"), *mine = m->cfg.lora.base_bf16 ? "bf16" : "fp32";
        const int other = dt && strcmp(dt, mine) != 0; /* the base rounded to bf16 (model.lora.base_dtype) or not */
        st = dt_error_set(DT_ERR_DATA, "%s: these adapters were trained on a base of digest %s%s%s, but the model's "
                          "frozen weights have digest %08x%s%s (hint: model.init_from must name the model they were "
                          "trained on%s%s)", path, want, other ? " kept in " : "", other ? dt : "", have,
                          other ? " kept in " : "", other ? mine : "", other ? ", and model.lora.base_dtype be " : "",
                          other ? dt : "");
        goto done;
    }

    const dt_st_tensor *lm_head = NULL;
    int j_wte = -1;
    for (int i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        const char *nm = canonical_name(m->net.arch, t->name);
        if (!nm) continue;
        int j = 0;
        while (j < m->n_tensors && (!IN_SET(j) || strcmp(m->tensors[j].name, nm) != 0)) j++;
        if (j == m->n_tensors && !adapters && strcmp(nm, m->net.arch->head_name) == 0 && (m->net.w.tied || m->cfg.shape.num_labels)) {
            if (m->net.w.tied) lm_head = t; /* the tied head's copy: checked against the embedding below */
            continue;                       /* an untied language model's head: a classifier has none */
        }
        if (j == m->n_tensors) {
            if (strcmp(nm, "score.weight") == 0 && m->cfg.shape.num_labels == 0) continue; /* classifier -> LM */
            if (adapters)
                st = dt_error_set(DT_ERR_DATA, "%s: tensor %s is not one of this model's adapters (model.lora: rank %d "
                                  "on its targets)", path, t->name, m->cfg.lora.rank);
            else
                st = dt_error_set(DT_ERR_DATA, "%s: tensor %s is not part of this model (hint: %s)", path, t->name,
                                  hint);
            goto done;
        }
        const dt_tensor_info *mt = &m->tensors[j];
        int64_t want[2] = {mt->whole[0], mt->whole[1]};
        int ok = t->ndim == mt->ndim && t->shape[0] == want[0] && (mt->ndim == 1 || t->shape[1] == want[1]);
        if (!ok) {
            shape_str(a, sizeof a, t->ndim, t->shape);
            shape_str(b, sizeof b, mt->ndim, want);
            st = dt_error_set(DT_ERR_DATA, "%s: tensor %s has shape %s but the config needs %s (hint: %s)", path,
                              t->name, a, b, hint);
            goto done;
        }
        if (from[j]) {
            st = dt_error_set(DT_ERR_DATA, "%s: tensor %s appears twice (with and without the %s prefix)", path, nm,
                              m->net.arch->hf_prefix);
            goto done;
        }
        from[j] = t;
        if (m->store[j] == m->net.w.wte) j_wte = j;
    }
    int score_ok = 1;
    for (int j = 0; j < m->n_tensors; j++) {
        if (from[j] || !IN_SET(j)) continue;
        if (strcmp(m->tensors[j].name, "score.weight") == 0) { score_ok = 0; continue; } /* PEFT's may lack it */
        st = dt_error_set(DT_ERR_DATA, "%s: tensor %s is missing (hint: %s)", path, m->tensors[j].name, hint);
        goto done;
    }
    if (lm_head && j_wte >= 0) {
        const dt_tensor_info *wte = &m->tensors[j_wte];
        if (lm_head->ndim != 2 || lm_head->shape[0] != wte->shape[0] || lm_head->shape[1] != wte->shape[1]) {
            st = dt_error_set(DT_ERR_DATA, "%s: tensor %s does not have %s's shape: an untied output head, which dtrain "
                              "cannot represent (its head is the token embedding)", path, lm_head->name, wte->name);
            goto done;
        }
    }
    for (int j = 0; j < m->n_tensors; j++)
        if (from[j] && (st = load_tensor(m, f, j, from[j], j == j_wte ? lm_head : NULL, v, path)) != DT_OK) goto done;
    if (score_loaded) *score_loaded = score_ok;
    if (!adapters) m->base_digest_ok = 0;
#undef IN_SET
done:
    free(from);
    free(v);
    dt_st_close(f);
    return st;
}

dt_status dt_model_load(dt_model *m, const char *path, int *score_loaded) { return load_weights(m, path, score_loaded, 0); }
dt_status dt_model_load_adapters(dt_model *m, const char *path, int *score_loaded) {
    return load_weights(m, path, score_loaded, 1);
}
