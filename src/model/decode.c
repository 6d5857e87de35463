/* decode.c — incremental decoding with a key/value cache (decode.h), over the op table and
 * the model's parameter buffer; the forward of dt_model_forward for the new rows only. */
#include "dtrain/decode.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFILL_ROWS 128 /* rows per forward when many tokens are fed at once (bounds the scratch) */
#define ALIGN 256

enum { W_LN1W, W_LN1B, W_QKVW, W_QKVB, W_PROJW, W_PROJB, W_LN2W, W_LN2B, W_FCW, W_FCB, W_FCPW, W_FCPB, W_N };
static const char *const w_names[W_N] = {
    "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias",
    "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias",
};

struct dt_decoder {
    dt_model *m;
    const dt_backend *be;
    dt_dtype act;
    int max_len, len;
    size_t (*w)[W_N];          /* (L) offsets of each layer's tensors in the parameter buffer */
    size_t wte, wpe, lnfw, lnfb;
    void *arena;
    dt_act **kc, **vc;         /* (L) (max_len, C) each */
    dt_act *x, *ln, *qkv, *atty, *tmp, *fch, *fchg; /* PREFILL_ROWS rows of C, 3C, 4C */
    dt_act *lnf, *logits;      /* (1, C), (1, V) */
    float *mean, *rstd;        /* (PREFILL_ROWS) */
    float *scratch;            /* (PREFILL_ROWS, NH, max_len) attention probabilities */
    int *tokens_dev;           /* (PREFILL_ROWS) */
    void *host_logits;         /* (V) the activation element */
};

static int find_tensor(const dt_model *m, const char *name, size_t *off) {
    for (int i = 0; i < dt_model_num_tensors(m); i++) {
        const dt_tensor_info *t = dt_model_tensor(m, i);
        if (strcmp(t->name, name) == 0) {
            *off = t->offset;
            return 1;
        }
    }
    return 0;
}

static dt_status find_weights(dt_decoder *d) {
    const int L = dt_model_config(d->m)->n_layer;
    char name[64];
    int ok = find_tensor(d->m, "wte.weight", &d->wte) && find_tensor(d->m, "wpe.weight", &d->wpe) &&
             find_tensor(d->m, "ln_f.weight", &d->lnfw) && find_tensor(d->m, "ln_f.bias", &d->lnfb);
    for (int l = 0; ok && l < L; l++)
        for (int i = 0; ok && i < W_N; i++) {
            snprintf(name, sizeof name, "h.%d.%s", l, w_names[i]);
            ok = find_tensor(d->m, name, &d->w[l][i]);
        }
    return ok ? DT_OK : dt_error_set(DT_ERR_INTERNAL, "decoder: the model lacks a GPT-2 tensor");
}

/* Carves the buffers out of one allocation; sizing only when base is NULL. Returns bytes. */
static size_t carve(dt_decoder *d, char *base) {
    const dt_model_cfg *c = dt_model_config(d->m);
    const size_t C = (size_t)c->n_embd, R = PREFILL_ROWS, P = (size_t)d->max_len, a = dt_dtype_size(d->act);
    size_t off = 0;
#define TAKE(ptr, bytes)                                          \
    do {                                                          \
        if (base) (ptr) = (void *)(base + off);                   \
        off += ((bytes) + ALIGN - 1) / ALIGN * ALIGN;             \
    } while (0)
    for (int l = 0; l < c->n_layer; l++) {
        TAKE(d->kc[l], P * C * a);
        TAKE(d->vc[l], P * C * a);
    }
    TAKE(d->x, R * C * a);
    TAKE(d->ln, R * C * a);
    TAKE(d->qkv, R * 3 * C * a);
    TAKE(d->atty, R * C * a);
    TAKE(d->tmp, R * C * a);
    TAKE(d->fch, R * 4 * C * a);
    TAKE(d->fchg, R * 4 * C * a);
    TAKE(d->lnf, C * a);
    TAKE(d->logits, (size_t)c->vocab_size * a);
    TAKE(d->mean, R * sizeof(float));
    TAKE(d->rstd, R * sizeof(float));
    TAKE(d->scratch, R * (size_t)c->n_head * P * sizeof(float));
    TAKE(d->tokens_dev, R * sizeof(int));
#undef TAKE
    return off;
}

dt_status dt_decoder_open(dt_decoder **out, dt_model *m, int max_len) {
    *out = NULL;
    const dt_model_cfg *c = dt_model_config(m);
    if (max_len < 1 || max_len > c->n_positions)
        return dt_error_set(DT_ERR_INTERNAL, "decoder: %d positions outside 1..%d", max_len, c->n_positions);
    dt_decoder *d = dt_calloc(1, sizeof *d, "decoder");
    if (!d) return DT_ERR_NOMEM;
    d->m = m;
    d->be = dt_model_backend(m);
    d->act = d->be->ops->act_dtype(d->be->ops->bf16(d->be->ctx));
    d->max_len = max_len;
    d->w = dt_calloc((size_t)c->n_layer, sizeof *d->w, "decoder weights");
    d->kc = dt_calloc((size_t)c->n_layer, sizeof *d->kc, "key cache");
    d->vc = dt_calloc((size_t)c->n_layer, sizeof *d->vc, "value cache");
    d->host_logits = dt_malloc((size_t)c->vocab_size * dt_dtype_size(d->act), "logits");
    dt_status st = !d->w || !d->kc || !d->vc || !d->host_logits ? DT_ERR_NOMEM : find_weights(d);
    if (st == DT_OK) {
        const size_t bytes = carve(d, NULL);
        char what[96];
        snprintf(what, sizeof what, "the key/value cache of %d positions (%.1f MiB)", max_len, (double)bytes / (1 << 20));
        st = d->be->ops->alloc(d->be->ctx, bytes, what, &d->arena);
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
    d->be->ops->free(d->be->ctx, d->arena);
    free(d->w);
    free(d->kc);
    free(d->vc);
    free(d->host_logits);
    free(d);
}

int dt_decoder_len(const dt_decoder *d) { return d->len; }
void dt_decoder_reset(dt_decoder *d) { d->len = 0; }


/* The layers over n <= PREFILL_ROWS new rows at positions len..len+n-1; x holds their input. */
static void forward_rows(dt_decoder *d, int n) {
    const dt_ops *o = d->be->ops;
    void *ctx = d->be->ctx;
    const dt_model_cfg *c = dt_model_config(d->m);
    const int C = c->n_embd, NH = c->n_head;
    const float *p = dt_model_params(d->m);
    for (int l = 0; l < c->n_layer; l++) {
        const size_t *w = d->w[l];
        o->layernorm_fwd(ctx, d->ln, d->mean, d->rstd, d->x, p + w[W_LN1W], p + w[W_LN1B], n, C);
        o->matmul_fwd(ctx, d->qkv, d->ln, p + w[W_QKVW], p + w[W_QKVB], n, C, 3 * C, 3 * C, 0);
        o->attention_cached(ctx, d->atty, d->kc[l], d->vc[l], d->scratch, d->qkv, d->len, n, C, NH);
        o->matmul_fwd(ctx, d->tmp, d->atty, p + w[W_PROJW], p + w[W_PROJB], n, C, C, C, 0);
        o->add(ctx, d->x, d->x, d->tmp, (size_t)n * C);
        o->layernorm_fwd(ctx, d->ln, d->mean, d->rstd, d->x, p + w[W_LN2W], p + w[W_LN2B], n, C);
        o->matmul_fwd(ctx, d->fch, d->ln, p + w[W_FCW], p + w[W_FCB], n, C, 4 * C, 4 * C, 0);
        o->gelu_fwd(ctx, d->fchg, d->fch, (size_t)n * 4 * C);
        o->matmul_fwd(ctx, d->tmp, d->fchg, p + w[W_FCPW], p + w[W_FCPB], n, 4 * C, C, C, 0);
        o->add(ctx, d->x, d->x, d->tmp, (size_t)n * C);
    }
}

dt_status dt_decoder_feed(dt_decoder *d, const int *tokens, int n, float *logits) {
    const dt_ops *o = d->be->ops;
    void *ctx = d->be->ctx;
    const dt_model_cfg *c = dt_model_config(d->m);
    const int C = c->n_embd, V = c->vocab_size;
    if (n < 1 || d->len + n > d->max_len)
        return dt_error_set(DT_ERR_INTERNAL, "decoder: %d tokens after %d of at most %d positions", n, d->len, d->max_len);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return dt_error_set(DT_ERR_DATA, "token %d is outside the vocabulary [0, %d) (hint: model.vocab_size)",
                                tokens[i], V);
    const float *p = dt_model_params(d->m);
    int rows = 0;
    for (int done = 0; done < n; done += rows) {
        rows = n - done < PREFILL_ROWS ? n - done : PREFILL_ROWS;
        o->upload(ctx, d->tokens_dev, tokens + done, (size_t)rows * sizeof(int));
        /* the position embeddings from row len on: wpe is (n_positions, C) */
        o->encoder_fwd(ctx, d->x, d->tokens_dev, p + d->wte, p + d->wpe + (size_t)d->len * C, 1, rows, C);
        forward_rows(d, rows);
        d->len += rows;
    }
    const size_t a = dt_dtype_size(d->act);
    const dt_act *last = (const dt_act *)((const char *)d->x + (size_t)(rows - 1) * C * a);
    o->layernorm_fwd(ctx, d->lnf, d->mean, d->rstd, last, p + d->lnfw, p + d->lnfb, 1, C);
    o->matmul_fwd(ctx, d->logits, d->lnf, p + d->wte, NULL, 1, C, V, V, 1);
    o->download(ctx, d->host_logits, d->logits, (size_t)V * a);
    DT_TRY(o->check(ctx));
    if (d->act == DT_DTYPE_F32) memcpy(logits, d->host_logits, (size_t)V * sizeof(float));
    else
        for (int v = 0; v < V; v++) logits[v] = dt_bf16_to_float(((const uint16_t *)d->host_logits)[v]);
    return DT_OK;
}
