/* generate.c — sampling and the generation loop over a key/value-cache decoder (generate.h). */
#include "dtrain/generate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/clock.h"
#include "dtrain/decode.h"

struct dt_gen_sampler {
    int n, top_k;
    double temperature, top_p;
    uint64_t state;
    int *idx;     /* (n) candidate ids, largest logit first */
    double *p;    /* (n) */
};

dt_status dt_gen_sampler_new(dt_gen_sampler **out, int n, double temperature, int top_k, double top_p, uint64_t seed) {
    *out = NULL;
    dt_gen_sampler *s = dt_calloc(1, sizeof *s, "sampler");
    if (!s) return DT_ERR_NOMEM;
    s->n = n;
    s->top_k = top_k > 0 && top_k < n ? top_k : n;
    s->temperature = temperature;
    s->top_p = top_p;
    s->state = seed;
    s->idx = dt_malloc((size_t)n * sizeof *s->idx, "sampler ids");
    s->p = dt_malloc((size_t)n * sizeof *s->p, "sampler probabilities");
    if (!s->idx || !s->p) {
        dt_gen_sampler_free(s);
        return DT_ERR_NOMEM;
    }
    *out = s;
    return DT_OK;
}

void dt_gen_sampler_free(dt_gen_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->p);
    free(s);
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int by_logit_desc(const void *a, const void *b, void *logits) {
    const int i = *(const int *)a, j = *(const int *)b;
    const float x = ((const float *)logits)[i], y = ((const float *)logits)[j];
    return x > y ? -1 : x < y ? 1 : (i > j) - (i < j); /* ties: the smaller id first */
}

int dt_gen_sampler_next(dt_gen_sampler *s, const float *logits) {
    int best = 0;
    for (int v = 1; v < s->n; v++)
        if (logits[v] > logits[best]) best = v;
    if (s->temperature <= 0) return best;
    int k = s->n;
    for (int v = 0; v < s->n; v++) s->idx[v] = v;
    if (s->top_k < s->n || s->top_p < 1.0) { /* candidates in order, largest first */
        qsort_r(s->idx, (size_t)s->n, sizeof *s->idx, by_logit_desc, (void *)logits);
        k = s->top_k;
    }
    double sum = 0;
    for (int i = 0; i < k; i++) sum += s->p[i] = exp(((double)logits[s->idx[i]] - logits[best]) / s->temperature);
    if (s->top_p < 1.0) { /* the smallest head of the sorted list that holds top_p of the mass */
        double acc = 0;
        int keep = 0;
        while (keep < k && acc < s->top_p * sum) acc += s->p[keep++];
        k = keep > 0 ? keep : 1;
        sum = acc > 0 ? acc : s->p[0];
    }
    const double u = (double)(splitmix64(&s->state) >> 11) * (1.0 / 9007199254740992.0) * sum; /* [0, sum) */
    double acc = 0;
    for (int i = 0; i < k; i++) {
        acc += s->p[i];
        if (u < acc) return s->idx[i];
    }
    return s->idx[k - 1]; /* rounding: the last candidate */
}

/* ---- generation ---- */

typedef struct gen {
    dt_decoder *dec;
    dt_gen_sampler *smp;
    dt_tokenizer *tok;  /* for decoding (bytes when the model's is NULL) */
    int own_tok;
    uint32_t *ids;      /* the text so far: prompt then new tokens */
    size_t n, cap;
    float *logits;
    int *feed_ids;      /* (positions the decoder holds) the ids fed, as the decoder takes them */
} gen;

static void gen_free(gen *g) {
    dt_decoder_free(g->dec);
    dt_gen_sampler_free(g->smp);
    if (g->own_tok) dt_tokenizer_free(g->tok);
    free(g->ids);
    free(g->logits);
    free(g->feed_ids);
}

/* The prompt's ids into g->ids, checked against the model's positions. */
static dt_status encode_prompt(gen *g, const dt_model_cfg *mc, const dt_gen_opts *o) {
    const int eot = g->own_tok || o->bare ? -1 : dt_tokenizer_eot(g->tok);
    if (o->bare && o->prompt_len == 0) return dt_error_set(DT_ERR_USAGE, "--prompt: empty");
    if (eot >= 0) { /* a document starts after the end-of-text token */
        g->ids = malloc(64 * sizeof *g->ids);
        if (!g->ids) return dt_error_set(DT_ERR_NOMEM, "out of memory");
        g->cap = 64;
        g->ids[g->n++] = (uint32_t)eot;
    } else if (o->prompt_len == 0) {
        return dt_error_set(DT_ERR_USAGE, "--prompt: empty, and the byte tokenizer has no end-of-text token to start "
                            "from (hint: give the text to continue)");
    }
    if (dt_tokenizer_encode(g->tok, o->prompt, o->prompt_len, &g->ids, &g->n, &g->cap) != DT_OK) {
        dt_error_prefix("--prompt");
        return DT_ERR_DATA;
    }
    if (g->n > (size_t)mc->shape.n_positions)
        return dt_error_set(DT_ERR_USAGE, "--prompt: %zu tokens%s, more than the model's %d positions "
                            "(model.n_positions) (hint: a shorter prompt)", g->n, eot >= 0 ? " with the end-of-text "
                            "token before them" : "", mc->shape.n_positions);
    return DT_OK;
}

static dt_status gen_open(gen *g, dt_model *m, dt_tokenizer *tok, const dt_gen_opts *o) {
    const dt_model_cfg *mc = dt_model_config(m);
    if (mc->shape.num_labels)
        return dt_error_set(DT_ERR_USAGE, "generate: the model is a classifier (model.num_labels: %d): generation "
                            "needs a language model (hint: dtrain predict labels texts)", mc->shape.num_labels);
    g->tok = tok;
    if (!tok) {
        DT_TRY(dt_tokenizer_open("bytes", &g->tok));
        g->own_tok = 1;
    }
    DT_TRY(encode_prompt(g, mc, o));
    const int V = mc->shape.vocab_size, nt = dt_tokenizer_vocab_size(g->tok);
    /* positions the text may fill: the last new token is never fed back */
    long need = (long)g->n + o->max_new_tokens - 1;
    const int max_len = need > mc->shape.n_positions ? mc->shape.n_positions : (int)need;
    g->logits = dt_malloc((size_t)V * sizeof(float), "logits");
    g->feed_ids = dt_malloc((size_t)(max_len > (int)g->n ? max_len : (int)g->n) * sizeof(int), "token ids");
    if (!g->logits || !g->feed_ids) return DT_ERR_NOMEM;
    DT_TRY(dt_gen_sampler_new(&g->smp, nt < V ? nt : V, o->temperature, o->top_k, o->top_p, o->seed));
    DT_TRY(dt_decoder_open(&g->dec, m, max_len > (int)g->n ? max_len : (int)g->n));
    if (mc->pp > 1) dt_decoder_set_stages(g->dec, o->pp_prev, o->pp_next);
    return DT_OK;
}

/* Feeds ids[from..n): with no_cache, the whole text from position 0 again. */
static dt_status feed(gen *g, size_t from, int no_cache) {
    if (no_cache) {
        dt_decoder_reset(g->dec);
        from = 0;
    }
    for (size_t i = from; i < g->n; i++) g->feed_ids[i - from] = (int)g->ids[i];
    return dt_decoder_feed(g->dec, g->feed_ids, (int)(g->n - from), g->logits);
}

static dt_status emit_token(gen *g, uint32_t id, dt_gen_emit_fn emit, void *user) {
    char *text;
    size_t len;
    DT_TRY(dt_tokenizer_decode(g->tok, &id, 1, &text, &len));
    emit(user, text, len);
    free(text);
    return DT_OK;
}

dt_status dt_generate(dt_model *m, dt_tokenizer *tok, const dt_gen_opts *o, dt_gen_emit_fn emit, void *user,
                      dt_gen_result *res) {
    memset(res, 0, sizeof *res);
    gen g = {0};
    dt_status st = gen_open(&g, m, tok, o);
    const int eot = st == DT_OK && !g.own_tok ? dt_tokenizer_eot(g.tok) : -1;
    const int P = dt_model_config(m)->shape.n_positions;
    double t0 = dt_clock_now();
    if (st == DT_OK) st = feed(&g, 0, 0);
    res->prompt_tokens = (int)g.n;
    res->prompt_s = dt_clock_now() - t0;
    t0 = dt_clock_now();
    while (st == DT_OK) {
        const uint32_t id = (uint32_t)dt_gen_sampler_next(g.smp, g.logits);
        if ((int)id == eot || (int)id == o->stop_id) {
            res->stop = 1;
            break;
        }
        res->new_tokens++;
        if ((st = emit_token(&g, id, emit, user)) != DT_OK) break;
        if (res->new_tokens == o->max_new_tokens) break;
        if (g.n == (size_t)P) {
            res->stop = 2;
            break;
        }
        if (g.n == g.cap) {
            uint32_t *p = realloc(g.ids, (g.cap ? 2 * g.cap : 64) * sizeof *p);
            if (!p) {
                st = dt_error_set(DT_ERR_NOMEM, "out of memory");
                break;
            }
            g.ids = p;
            g.cap = g.cap ? 2 * g.cap : 64;
        }
        g.ids[g.n++] = id;
        st = feed(&g, g.n - 1, o->no_cache);
    }
    res->decode_s = dt_clock_now() - t0;
    gen_free(&g);
    return st;
}
