/* decode.c — incremental decoding with a key/value cache (decode.h): the model's own layer
 * (net.c) over the new rows only, attention reading the earlier positions from the cache. */
#include "dtrain/decode.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net.h"

#define PREFILL_ROWS 128 /* rows per forward when many tokens are fed at once (bounds the scratch) */
#define ALIGN 256

struct dt_decoder {
    dt_model *m;
    dt_net net;                /* the model's ops, architecture, parameters; lora_h the decoder's own */
    const dt_net *n;           /* &net */
    int max_len, len;
    void *arena;
    dt_act **kc, **vc;         /* (L) (max_len, NKV * hs) each */
    dt_act *x[2];              /* (PREFILL_ROWS, C): a layer's input and output, in turn */
    net_acts a;                /* one layer's buffers for PREFILL_ROWS rows, shared by every layer */
    dt_act *lnf, *logits;      /* (1, C), (1, V) */
    float *mean, *rstd;        /* (PREFILL_ROWS) */
    float *scratch;            /* (PREFILL_ROWS, NH, max_len) attention probabilities */
    int *tokens_dev;           /* (PREFILL_ROWS) */
    void *host_logits;         /* (V) the activation element */
    float *shares;             /* tensor parallelism: host (tp + 1, the largest part of V) the shares' logits, and
                                  this one's */
    int lo, hi;                /* the layers it runs (pipeline stages: its stage's; else all) */
    int staged;                /* pipeline stages: dt_decoder_set_stages was called */
    dt_comm *prev, *next;      /* ... its pairs with the stages before and after (NULL at the ends) */
};

/* Carves the buffers out of one allocation; sizing only when base is NULL. Returns bytes. */
static size_t carve(dt_decoder *d, char *base) {
    const dt_model_cfg *c = dt_model_config(d->m);
    const net_layer *y = &d->n->w.layers[0];
    const size_t C = (size_t)c->shape.n_embd, R = PREFILL_ROWS, P = (size_t)d->max_len, a = dt_dtype_size(d->n->act);
    size_t off = 0;
#define TAKE(ptr, bytes)                                          \
    do {                                                          \
        if (base) (ptr) = (void *)(base + off);                   \
        off += ((bytes) + ALIGN - 1) / ALIGN * ALIGN;             \
    } while (0)
    const size_t KV = (size_t)d->n->att.NKV * (size_t)d->n->att.hs; /* the cache holds the key/value heads only */
    for (int l = d->lo; l < d->hi; l++) {
        TAKE(d->kc[l], P * KV * a);
        TAKE(d->vc[l], P * KV * a);
    }
    TAKE(d->x[0], R * C * a);
    TAKE(d->x[1], R * C * a);
    TAKE(d->a.norm1, R * C * a);
    TAKE(d->a.qkv, R * (size_t)y->qkv.out * a);
    TAKE(d->a.atty, R * (size_t)y->attn_out.in * a);
    TAKE(d->a.res2, R * C * a);
    TAKE(d->a.mlp_pre, R * (size_t)y->mlp_in.out * a);
    TAKE(d->a.mlp_act, R * (size_t)y->mlp_out.in * a);
    TAKE(d->lnf, C * a);
    TAKE(d->logits, (size_t)c->shape.vocab_size * a);
    TAKE(d->mean, R * sizeof(float));
    TAKE(d->rstd, R * sizeof(float));
    TAKE(d->scratch, R * (size_t)c->shape.n_head * P * sizeof(float));
    TAKE(d->tokens_dev, R * sizeof(int));
    /* model.lora's x A^T for the rows of a forward (net.h lora_h: nothing kept; the model's own
     * holds its batch's rows, which generation builds as one, dt_infer_load(s, 1, 1)) */
    TAKE(d->net.lora_h, R * (size_t)d->n->lora_rank * sizeof(float));
#undef TAKE
    /* both norms of a layer write the same buffers: nothing reads the first after the second */
    d->a.norm2 = d->a.norm1;
    d->a.norm1_mean = d->a.norm2_mean = d->mean;
    d->a.norm1_rstd = d->a.norm2_rstd = d->rstd;
    return off;
}

dt_status dt_decoder_open(dt_decoder **out, dt_model *m, int max_len) {
    *out = NULL;
    const dt_model_cfg *c = dt_model_config(m);
    if (max_len < 1 || max_len > c->shape.n_positions)
        return dt_error_set(DT_ERR_INTERNAL, "decoder: %d positions outside 1..%d", max_len, c->shape.n_positions);
    dt_decoder *d = dt_calloc(1, sizeof *d, "decoder");
    if (!d) return DT_ERR_NOMEM;
    d->m = m;
    d->net = *dt_model_net(m);
    d->n = &d->net;
    d->max_len = max_len;
    dt_model_stage_layers(c, c->pp > 1 ? c->pp_rank : 0, &d->lo, &d->hi);
    d->kc = dt_calloc((size_t)c->shape.n_layer, sizeof *d->kc, "key cache");
    d->vc = dt_calloc((size_t)c->shape.n_layer, sizeof *d->vc, "value cache");
    d->host_logits = dt_malloc((size_t)c->shape.vocab_size * dt_dtype_size(d->n->act), "logits");
    if (d->n->tp > 1)
        d->shares = dt_malloc((size_t)(d->n->tp + 1) * (size_t)net_part_len(c->shape.vocab_size, d->n->tp, 0) *
                                  sizeof(float), "logits of the shares");
    dt_status st = !d->kc || !d->vc || !d->host_logits || (d->n->tp > 1 && !d->shares) ? DT_ERR_NOMEM : DT_OK;
    if (st == DT_OK) {
        const size_t bytes = carve(d, NULL);
        char what[96];
        snprintf(what, sizeof what, "the key/value cache of %d positions (%.1f MiB)", max_len, (double)bytes / (1 << 20));
        st = d->n->o->alloc(d->n->ctx, bytes, what, &d->arena);
        if (st == DT_OK) carve(d, d->arena);
    }
    if (st != DT_OK) {
        dt_decoder_free(d);
        return st;
    }
    *out = d;
    return DT_OK;
}

void dt_decoder_free(dt_decoder *d) {
    if (!d) return;
    d->n->o->free(d->n->ctx, d->arena);
    free(d->kc);
    free(d->vc);
    free(d->host_logits);
    free(d->shares);
    free(d);
}

void dt_decoder_set_stages(dt_decoder *d, dt_comm *prev, dt_comm *next) {
    d->prev = prev;
    d->next = next;
    d->staged = 1;
}

int dt_decoder_len(const dt_decoder *d) { return d->len; }
void dt_decoder_reset(dt_decoder *d) { d->len = 0; }


/* Tensor parallelism: the whole row of logits from every share's part (the vocabulary split,
 * net_part_lo): one all-gather, each part padded to the largest; every share gets the same row,
 * so that the shares sample the same token. Float activations (tensor parallelism is CPU-only). */
static dt_status shares_logits(dt_decoder *d, float *logits) {
    const dt_net *net = d->n;
    const int V = dt_model_config(d->m)->shape.vocab_size, tp = net->tp, most = net_part_len(V, tp, 0);
    if (*net->tp_st != DT_OK) return *net->tp_st; /* a sum of the layers failed */
    float *all = d->shares, *mine = all + (size_t)tp * most;
    net->o->download(net->ctx, mine, d->logits, (size_t)net->n_vocab * sizeof(float));
    dt_status st = net->o->check(net->ctx);
    if (st == DT_OK) st = dt_comm_allgather(net->tp_comm, mine, (size_t)most * sizeof(float), all);
    for (int r = 0; st == DT_OK && r < tp; r++)
        memcpy(logits + net_part_lo(V, tp, r), all + (size_t)r * most, (size_t)net_part_len(V, tp, r) * sizeof(float));
    return st;
}

/* The logits from the last stage to the others: from each stage's next to it, then on to its
 * prev (pairs: the stage before is rank 0) */
static dt_status stage_logits(dt_decoder *d, float *logits, int V) {
    if (d->next) DT_TRY(dt_comm_broadcast(d->next, logits, (size_t)V * sizeof(float), 1));
    if (d->prev) DT_TRY(dt_comm_broadcast(d->prev, logits, (size_t)V * sizeof(float), 1));
    return DT_OK;
}

/* the next-token logits after row `last` (the final norm and the head) into logits (host) */
static dt_status head_logits(dt_decoder *d, const dt_act *last, float *logits) {
    const dt_net *net = d->n;
    const dt_ops *o = net->o;
    void *ctx = net->ctx;
    const int V = dt_model_config(d->m)->shape.vocab_size;
    dt_net_norm_fwd(net, &net->w.final_norm, d->lnf, d->mean, d->rstd, last, 1);
    dt_net_mm_fwd(net, &net->w.head, d->logits, d->lnf, 1, V, NULL, NULL);
    if (net->tp > 1) return shares_logits(d, logits);
    const size_t a = dt_dtype_size(net->act);
    o->download(ctx, d->host_logits, d->logits, (size_t)V * a);
    DT_TRY(o->check(ctx));
    if (net->act == DT_DTYPE_F32) memcpy(logits, d->host_logits, (size_t)V * sizeof(float));
    else
        for (int v = 0; v < V; v++) logits[v] = dt_bf16_to_float(((const uint16_t *)d->host_logits)[v]);
    return DT_OK;
}

dt_status dt_decoder_feed(dt_decoder *d, const int *tokens, int n, float *logits) {
    const dt_net *net = d->n;
    const dt_ops *o = net->o;
    void *ctx = net->ctx;
    const dt_model_cfg *c = dt_model_config(d->m);
    const int C = c->shape.n_embd, V = c->shape.vocab_size;
    const int first = c->pp <= 1 || c->pp_rank == 0, last_stage = c->pp <= 1 || c->pp_rank == c->pp - 1;
    if (c->pp > 1 && !d->staged)
        return dt_error_set(DT_ERR_INTERNAL, "decoder: stage %d of %d without its neighbours", c->pp_rank, c->pp);
    if (n < 1 || d->len + n > d->max_len)
        return dt_error_set(DT_ERR_INTERNAL, "decoder: %d tokens after %d of at most %d positions", n, d->len, d->max_len);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return dt_error_set(DT_ERR_DATA, "token %d is outside the vocabulary [0, %d) (hint: model.vocab_size)",
                                tokens[i], V);
    const size_t a = dt_dtype_size(net->act);
    int rows = 0;
    dt_act *x = d->x[0];
    for (int done = 0; done < n; done += rows) {
        rows = n - done < PREFILL_ROWS ? n - done : PREFILL_ROWS;
        if (first) {
            o->upload(ctx, d->tokens_dev, tokens + done, (size_t)rows * sizeof(int));
            dt_net_embed(net, d->x[0], d->tokens_dev, 1, rows, d->len);
        } else { /* the stage before's rows */
            DT_TRY(dt_comm_broadcast(d->prev, d->x[0], (size_t)rows * C * a, 0));
        }
        x = d->x[0];
        for (int l = d->lo; l < d->hi; l++) { /* the layer training runs, its keys and values into the cache */
            const net_span s = {.B = 1, .T = rows, .pos0 = d->len, .kc = d->kc[l], .vc = d->vc[l], .scratch = d->scratch};
            net_acts acts = d->a;
            acts.res3 = d->x[(l - d->lo + 1) % 2];
            dt_net_layer_fwd(net, l, &acts, x, &s);
            x = acts.res3;
        }
        if (!last_stage) DT_TRY(dt_comm_broadcast(d->next, x, (size_t)rows * C * a, 0)); /* on to the next stage */
        d->len += rows;
    }
    if (last_stage) DT_TRY(head_logits(d, (const dt_act *)((const char *)x + (size_t)(rows - 1) * C * a), logits));
    return c->pp > 1 ? stage_logits(d, logits, V) : DT_OK;
}
