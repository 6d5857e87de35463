/* test_decode.c — the key/value-cache decoder (decode.h) against the model's own forward:
 * for random weights and a random sequence, the decoder's next-token logits at every position
 * give the same argmax as dt_model_forward's predictions and the same loss (summed over the
 * positions) as its cross-entropy; feeding one token at a time, in chunks (across the
 * decoder's 128-row prefill split) and all at once from a reset (no cache) agree; bad
 * tokens and overlong input are refused. Then the sampler's distributions (temperature,
 * top-k, top-p, the seed, the id limit) and dt_generate's greedy text against the argmax of
 * dt_model_forward over that text. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtrain/backend.h"
#include "dtrain/decode.h"
#include "dtrain/generate.h"
#include "dtrain/model.h"

static double row_loss(const float *logits, int V, int target) {
    double mx = logits[0], sum = 0;
    for (int v = 1; v < V; v++) mx = logits[v] > mx ? logits[v] : mx;
    for (int v = 0; v < V; v++) sum += exp((double)logits[v] - mx);
    return log(sum) - ((double)logits[target] - mx);
}

static int argmax(const float *x, int V) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (x[v] > x[best]) best = v;
    return best;
}

/* the model of shape sh (n_positions T + 3) decoded token by token, in chunks and without the
 * cache, against its training forward */
static void check_shape_against_forward(int T, dt_model_shape sh) {
    const int C = sh.n_embd, NH = sh.n_head, L = sh.n_layer, V = sh.vocab_size;
    dt_backend *be;
    CHECK(dt_backend_open(DT_DEVICE_CPU, &(dt_backend_cfg){.threads = 1}, &be) == DT_OK);
    sh.n_positions = T + 3;
    dt_model_cfg mc = {.shape = sh, .seq_len = T, .max_batch = 1, .seed = 7};
    dt_model *m;
    CHECK(dt_model_init(&m, &mc, be) == DT_OK);
    /* weights 15x their initial scale, so that the logits are far from uniform */
    float *w = dt_model_params(m);
    for (size_t i = 0; i < dt_model_num_params(m); i++) w[i] *= 15.0f;
    dt_model_params_changed(m);
    int *tok = malloc((size_t)T * sizeof(int)), *tgt = malloc((size_t)T * sizeof(int));
    uint64_t s = 99;
    for (int t = 0; t < T; t++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[t] = (int)((s >> 33) % (uint64_t)V);
    }
    for (int t = 0; t < T; t++) tgt[t] = t + 1 < T ? tok[t + 1] : -1;
    dt_fwd_result r;
    CHECK(dt_model_forward(m, tok, tgt, 1, &r) == DT_OK);
    int *pred = malloc((size_t)T * sizeof(int));
    memcpy(pred, r.pred, (size_t)T * sizeof(int));

    dt_decoder *d;
    CHECK(dt_decoder_open(&d, m, T) == DT_OK);
    float *lg = malloc((size_t)V * sizeof(float)), *all = malloc((size_t)T * V * sizeof(float));
    double loss = 0;
    int same = 0;
    for (int t = 0; t < T; t++) { /* one token at a time */
        CHECK(dt_decoder_feed(d, tok + t, 1, lg) == DT_OK);
        CHECK_INT_EQ(dt_decoder_len(d), t + 1);
        memcpy(all + (size_t)t * V, lg, (size_t)V * sizeof(float));
        same += argmax(lg, V) == pred[t];
        if (tgt[t] >= 0) loss += row_loss(lg, V, tgt[t]);
    }
    CHECK_INT_EQ(same, T);
    CHECK(fabs(loss - r.loss_sum) <= 1e-5 * fabs(r.loss_sum));
    /* chunks: a prefill, then the rest at once; and from a reset, every prefix at once (no cache) */
    dt_decoder_reset(d);
    const int a = T / 2 + 1;
    CHECK(dt_decoder_feed(d, tok, a, lg) == DT_OK);
    double worst = 0;
    for (int v = 0; v < V; v++) worst = fmax(worst, fabs(lg[v] - all[(size_t)(a - 1) * V + v]));
    if (T > a) {
        CHECK(dt_decoder_feed(d, tok + a, T - a, lg) == DT_OK);
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs(lg[v] - all[(size_t)(T - 1) * V + v]));
    }
    for (int t = 1; t <= T; t += T / 5 + 1) {
        dt_decoder_reset(d);
        CHECK(dt_decoder_feed(d, tok, t, lg) == DT_OK);
        for (int v = 0; v < V; v++) worst = fmax(worst, fabs(lg[v] - all[(size_t)(t - 1) * V + v]));
    }
    printf("decoder %s T %d C %d NH %d NKV %d L %d V %d: argmax = forward's at %d/%d positions, loss %.9g vs %.9g, "
           "chunked/no-cache logits within %.2e\n", dt_arch_name(sh.arch), T, C, NH, dt_shape_kv_heads(&sh), L, V, same,
           T, loss, r.loss_sum, worst);
    CHECK(worst <= 1e-4);
    /* refusals: past the end, a token outside the vocabulary */
    CHECK(dt_decoder_feed(d, tok, T, lg) == DT_ERR_INTERNAL);
    dt_decoder_reset(d);
    int bad = V;
    CHECK(dt_decoder_feed(d, &bad, 1, lg) == DT_ERR_DATA);
    CHECK(strstr(dt_error_msg(), "outside the vocabulary") != NULL);
    CHECK(dt_decoder_open(&(dt_decoder *){NULL}, m, T + 4) == DT_ERR_INTERNAL);
    dt_decoder_free(d);
    dt_model_free(m);
    dt_backend_close(be);
    free(tok); free(tgt); free(pred); free(lg); free(all);
}

static void check_against_forward(int T, int C, int NH, int L, int V) {
    check_shape_against_forward(T, (dt_model_shape){.vocab_size = V, .n_layer = L, .n_head = NH, .n_embd = C});
}

/* a Llama: rotary positions continue at the cache's length, grouped-query heads, the cache of
 * key/value heads only */
static void check_llama_against_forward(int T, int C, int NH, int NKV, int hs, int L, int V) {
    check_shape_against_forward(T, (dt_model_shape){.arch = DT_ARCH_LLAMA, .vocab_size = V, .n_layer = L, .n_head = NH,
                                                    .n_embd = C, .num_key_value_heads = NKV, .head_dim = hs,
                                                    .intermediate_size = 3 * C, .rope_theta = 10000.0,
                                                    .rms_norm_eps = 1e-5});
}

/* model.lora: generation builds its model for one row (dt_infer_load(s, 1, 1)) and decodes a
 * whole prompt at once; the adapters' scratch must be the decoder's rows', not the model's one.
 * The same weights (random adapters, B not zero) in a model of T rows give the forward. */
static void check_lora_decode(int T) {
    const int V = 41;
    dt_backend *be;
    CHECK(dt_backend_open(DT_DEVICE_CPU, &(dt_backend_cfg){.threads = 1}, &be) == DT_OK);
    dt_model_cfg mc = {.shape = {.arch = DT_ARCH_LLAMA, .vocab_size = V, .n_positions = T, .n_layer = 2, .n_head = 4,
                                 .n_embd = 32, .num_key_value_heads = 2, .intermediate_size = 48, .rope_theta = 10000.0,
                                 .rms_norm_eps = 1e-5},
                       .seq_len = T, .max_batch = 1, .seed = 3,
                       .lora = {.rank = 4, .alpha = 8, .targets = dt_lora_arch_targets(DT_ARCH_LLAMA)}};
    dt_model *full, *one;
    CHECK(dt_model_init(&full, &mc, be) == DT_OK);
    mc.seq_len = 1; /* as generation builds it */
    CHECK(dt_model_init(&one, &mc, be) == DT_OK);
    float *a = dt_model_params(full), *b = dt_model_params(one);
    uint64_t s = 5;
    for (size_t i = 0; i < dt_model_num_params(full); i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        a[i] = b[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    dt_model_params_changed(full);
    dt_model_params_changed(one);
    int *tok = malloc((size_t)T * sizeof(int)), *tgt = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) tok[t] = (t * 7 + 3) % V;
    for (int t = 0; t < T; t++) tgt[t] = t + 1 < T ? tok[t + 1] : -1;
    dt_fwd_result r;
    CHECK(dt_model_forward(full, tok, tgt, 1, &r) == DT_OK);
    const int last = r.pred[T - 2];
    dt_decoder *d;
    CHECK(dt_decoder_open(&d, one, T) == DT_OK);
    float *lg = malloc((size_t)V * sizeof(float)), *bulk = malloc((size_t)V * sizeof(float));
    CHECK(dt_decoder_feed(d, tok, T - 1, bulk) == DT_OK); /* T - 1 rows at once into a one-row model */
    const double want = r.loss_sum;
    double loss = 0;
    dt_decoder_reset(d);
    for (int t = 0; t < T - 1; t++) {
        CHECK(dt_decoder_feed(d, tok + t, 1, lg) == DT_OK);
        loss += row_loss(lg, V, tgt[t]);
    }
    double worst = 0;
    for (int v = 0; v < V; v++) worst = fmax(worst, fabs(lg[v] - bulk[v]));
    printf("decoder with LoRA adapters, %d rows at once into a model of one row: argmax %d (forward %d), logits "
           "within %.2e of one row at a time, whose loss is %.9g (forward %.9g)\n", T - 1, argmax(bulk, V), last, worst,
           loss, want);
    CHECK_INT_EQ(argmax(bulk, V), last);
    CHECK(worst <= 1e-4);
    CHECK(fabs(loss - want) <= 1e-5 * fabs(want));
    dt_decoder_free(d);
    dt_model_free(one);
    dt_model_free(full);
    dt_backend_close(be);
    free(tok); free(tgt); free(lg); free(bulk);
}

/* frequencies of n draws from logits ln(p) */
static void draw(double temperature, int top_k, double top_p, uint64_t seed, int limit, double freq[4]) {
    const float logits[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    dt_gen_sampler *s;
    CHECK(dt_gen_sampler_new(&s, limit, temperature, top_k, top_p, seed) == DT_OK);
    const int n = 40000;
    for (int k = 0; k < 4; k++) freq[k] = 0;
    for (int i = 0; i < n; i++) {
        int id = dt_gen_sampler_next(s, logits);
        CHECK(id >= 0 && id < limit);
        freq[id] += 1.0 / n;
    }
    dt_gen_sampler_free(s);
}

static void check_freq(const char *what, const double got[4], const double want[4]) {
    printf("sampler %-26s %.3f %.3f %.3f %.3f (expected %.3f %.3f %.3f %.3f)\n", what, got[0], got[1], got[2], got[3],
           want[0], want[1], want[2], want[3]);
    for (int k = 0; k < 4; k++) CHECK(fabs(got[k] - want[k]) < 0.012);
}

static void test_sampler(void) {
    double f[4], g[4];
    draw(1.0, 0, 1.0, 1, 4, f);
    check_freq("temperature 1", f, (double[4]){0.5, 0.3, 0.15, 0.05});
    draw(1.0, 2, 1.0, 2, 4, f);
    check_freq("top-k 2", f, (double[4]){0.625, 0.375, 0, 0});
    draw(1.0, 0, 0.85, 3, 4, f); /* 0.5 + 0.3 < 0.85: the third is needed too */
    check_freq("top-p 0.85", f, (double[4]){0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0});
    draw(1.0, 0, 0.5, 4, 4, f);
    check_freq("top-p 0.5", f, (double[4]){1, 0, 0, 0});
    draw(2.0, 0, 1.0, 5, 4, f); /* p^(1/2), renormalised */
    const double r[4] = {sqrt(0.5), sqrt(0.3), sqrt(0.15), sqrt(0.05)}, rs = r[0] + r[1] + r[2] + r[3];
    check_freq("temperature 2", f, (double[4]){r[0] / rs, r[1] / rs, r[2] / rs, r[3] / rs});
    draw(1.0, 0, 1.0, 6, 2, f); /* only ids below the limit */
    check_freq("ids below 2", f, (double[4]){0.625, 0.375, 0, 0});
    draw(0.0, 0, 1.0, 7, 4, f);
    check_freq("temperature 0", f, (double[4]){1, 0, 0, 0});
    draw(1.0, 3, 0.9, 11, 4, f); /* the same seed: the same draws */
    draw(1.0, 3, 0.9, 11, 4, g);
    for (int k = 0; k < 4; k++) CHECK(f[k] == g[k]);
    const float tie[3] = {1.0f, 3.0f, 3.0f}; /* greedy: the first of equal logits */
    dt_gen_sampler *s;
    CHECK(dt_gen_sampler_new(&s, 3, 0.0, 0, 1.0, 0) == DT_OK);
    CHECK_INT_EQ(dt_gen_sampler_next(s, tie), 1);
    dt_gen_sampler_free(s);
}

typedef struct { char text[256]; size_t n; } sink;
static void collect(void *user, const char *bytes, size_t n) {
    sink *k = user;
    CHECK(k->n + n < sizeof k->text);
    memcpy(k->text + k->n, bytes, n);
    k->n += n;
}

/* greedy dt_generate (bytes) = the argmax of dt_model_forward over the generated text */
static void test_greedy_is_argmax(void) {
    dt_backend *be;
    CHECK(dt_backend_open(DT_DEVICE_CPU, &(dt_backend_cfg){.threads = 1}, &be) == DT_OK);
    dt_model_cfg mc = {.shape = {.vocab_size = 257, .n_positions = 64, .n_layer = 2, .n_head = 2, .n_embd = 16},
                       .seq_len = 1, .max_batch = 1, .seed = 3};
    dt_model *gm, *fm;
    CHECK(dt_model_init(&gm, &mc, be) == DT_OK);
    const char *prompt = "Hello, ";
    const int np = (int)strlen(prompt), nnew = 30;
    mc.seq_len = np + nnew;
    CHECK(dt_model_init(&fm, &mc, be) == DT_OK);
    float *w = dt_model_params(gm);
    for (size_t i = 0; i < dt_model_num_params(gm); i++) w[i] *= 15.0f;
    dt_model_params_changed(gm);
    memcpy(dt_model_params(fm), w, dt_model_num_params(gm) * sizeof(float));
    dt_model_params_changed(fm);
    sink out = {{0}, 0};
    dt_gen_opts o = {.prompt = prompt, .prompt_len = (size_t)np, .max_new_tokens = nnew, .temperature = 0, .top_p = 1,
                     .stop_id = -1};
    dt_gen_result r;
    CHECK(dt_generate(gm, NULL, &o, collect, &out, &r) == DT_OK);
    CHECK_INT_EQ(r.new_tokens, nnew);
    CHECK_INT_EQ(r.prompt_tokens, np);
    CHECK_INT_EQ((int)out.n, nnew); /* bytes: one byte per token (the greedy ids are < 256) */
    int tok[64], tgt[64];
    for (int t = 0; t < np + nnew; t++) tok[t] = (unsigned char)(t < np ? prompt[t] : out.text[t - np]);
    for (int t = 0; t < np + nnew; t++) tgt[t] = t + 1 < np + nnew ? tok[t + 1] : -1;
    dt_fwd_result fr;
    CHECK(dt_model_forward(fm, tok, tgt, 1, &fr) == DT_OK);
    int same = 0;
    for (int t = np - 1; t < np + nnew - 1; t++) same += fr.pred[t] == tok[t + 1];
    printf("greedy generate: %d of %d new tokens = dt_model_forward's argmax\n", same, nnew);
    CHECK_INT_EQ(same, nnew);
    /* the bytes tokenizer has no end-of-text token: an empty prompt is refused */
    o.prompt_len = 0;
    CHECK(dt_generate(gm, NULL, &o, collect, &out, &r) == DT_ERR_USAGE);
    dt_model_free(gm);
    dt_model_free(fm);
    dt_backend_close(be);
}

int main(void) {
    test_sampler();
    test_greedy_is_argmax();
    check_against_forward(37, 32, 4, 2, 61);
    check_against_forward(300, 16, 2, 1, 50); /* longer than the decoder's 128-row prefill */
    check_against_forward(1, 8, 8, 1, 5);     /* one position, head size 1 */
    check_llama_against_forward(37, 32, 4, 2, 8, 2, 61);
    check_llama_against_forward(150, 16, 6, 3, 4, 1, 50); /* past the prefill, 6 query heads on 3 */
    check_llama_against_forward(5, 8, 2, 1, 6, 1, 7);     /* one key/value head; NH * hs != n_embd */
    check_lora_decode(100);
    TEST_PASS("test_decode");
}
