/* test_ops_cuda.c — (label gpu) every op of the CUDA backend against the CPU backend, the
 * reference, on fresh random inputs; then the whole model's loss and gradients, CPU vs GPU.
 * Skips (77) without a usable GPU. `--quick` uses smaller shapes (for compute-sanitizer).
 *
 * Error measure: relative L2, ||gpu - cpu|| / max(||cpu||, 1e-30). Tolerances: fp32 1e-5
 * for single ops (3e-5 where a long reduction is summed in another order), bf16 1e-2 for the
 * products (inputs rounded to 8 bits of mantissa), and for the model's gradients through two
 * layers 1e-4 (fp32) and 5e-2 (bf16). Parameter-gradient ops start from non-zero gradients, so
 * an op that overwrites instead of accumulating fails. Reductions must be deterministic: the
 * ones that promise it are run twice and compared bit for bit. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "check.h"
#include "dtrain/cuda.h"
#include "dtrain/model.h"
#include "dtrain/ops.h"

static dt_ops *g_cpu, *g_gpu;
static int g_quick;
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static int g_failures;

static double urand(void) { /* [0,1) from splitmix64 */
    uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (double)((z ^ (z >> 31)) >> 11) / 9007199254740992.0;
}

static float *rand_host(size_t n, float lo, float hi) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    CHECK(h);
    for (size_t i = 0; i < n; i++) h[i] = (float)(lo + (hi - lo) * urand());
    return h;
}

static int *rand_ints(size_t n, int lo, int hi) { /* [lo, hi) */
    int *h = malloc((n ? n : 1) * sizeof(int));
    CHECK(h);
    for (size_t i = 0; i < n; i++) h[i] = lo + (int)(urand() * (hi - lo));
    return h;
}

/* A tensor held by both backends, same contents. */
typedef struct pair {
    void *c, *g;
    size_t bytes;
} pair;

static pair pair_new(const void *host, size_t bytes) {
    pair p = {NULL, NULL, bytes};
    CHECK(g_cpu->alloc(g_cpu->ctx, bytes, "test", &p.c) == DT_OK);
    if (g_gpu->alloc(g_gpu->ctx, bytes, "test", &p.g) != DT_OK) {
        fprintf(stderr, "%s\n", dt_error_msg());
        exit(1);
    }
    if (host) {
        g_cpu->upload(g_cpu->ctx, p.c, host, bytes);
        g_gpu->upload(g_gpu->ctx, p.g, host, bytes);
    }
    return p;
}
static pair pair_rand(size_t n, float lo, float hi) {
    float *h = rand_host(n, lo, hi);
    pair p = pair_new(h, n * sizeof(float));
    free(h);
    return p;
}
static pair pair_ints(const int *h, size_t n) { return pair_new(h, n * sizeof(int)); }
static void pair_free(pair *p) {
    g_cpu->free(g_cpu->ctx, p->c);
    g_gpu->free(g_gpu->ctx, p->g);
}
#define C_(p) ((float *)(p).c)
#define G_(p) ((float *)(p).g)

static void gpu_ok(void) {
    if (g_gpu->check(g_gpu->ctx) != DT_OK) {
        fprintf(stderr, "GPU op failed: %s\n", dt_error_msg());
        exit(1);
    }
}

/* relative L2 error of the GPU copy against the CPU copy of n floats; prints and counts a
 * failure above tol */
static double compare(const char *what, const pair *p, size_t n, double tol) {
    gpu_ok();
    float *g = malloc(n * sizeof(float) + 1);
    CHECK(g);
    g_gpu->download(g_gpu->ctx, g, p->g, n * sizeof(float));
    gpu_ok();
    const float *c = p->c;
    double num = 0, den = 0, worst = 0;
    size_t at = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        double d = (double)g[i] - (double)c[i];
        if (!isfinite(g[i])) finite = 0;
        num += d * d;
        den += (double)c[i] * c[i];
        if (fabs(d) > worst) { worst = fabs(d); at = i; }
    }
    double rel = sqrt(num) / fmax(sqrt(den), 1e-30);
    int ok = finite && rel <= tol;
    printf("  %-44s rel L2 %.3e (tol %.0e)%s", what, rel, tol, ok ? "\n" : "  FAIL");
    if (!ok) {
        printf(" worst at %zu: gpu %.9g cpu %.9g%s\n", at, n ? g[at] : 0.0f, n ? c[at] : 0.0f,
               finite ? "" : " (non-finite values)");
        g_failures++;
    }
    free(g);
    return rel;
}

static void compare_ints(const char *what, const pair *p, size_t n) {
    gpu_ok();
    int *g = malloc(n * sizeof(int) + 1);
    CHECK(g);
    g_gpu->download(g_gpu->ctx, g, p->g, n * sizeof(int));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += g[i] != ((int *)p->c)[i];
    printf("  %-44s %zu of %zu differ%s\n", what, bad, n, bad ? "  FAIL" : "");
    if (bad) g_failures++;
    free(g);
}

/* the GPU buffer's bytes are the same after running `again` once more from the same start */
static void check_bitwise_same(const char *what, const void *first, const pair *p) {
    void *h = malloc(p->bytes);
    CHECK(h);
    g_gpu->download(g_gpu->ctx, h, p->g, p->bytes);
    gpu_ok();
    int same = memcmp(h, first, p->bytes) == 0;
    printf("  %-44s %s\n", what, same ? "bit-identical on rerun" : "DIFFERS on rerun  FAIL");
    if (!same) g_failures++;
    free(h);
}

static void *download_copy(const pair *p) {
    void *h = malloc(p->bytes);
    CHECK(h);
    g_gpu->download(g_gpu->ctx, h, p->g, p->bytes);
    gpu_ok();
    return h;
}

/* ---- single ops ---- */

static void test_encoder(void) {
    const int B = 3, T = g_quick ? 17 : 64, C = g_quick ? 24 : 96, V = 50;
    int *tok = rand_ints((size_t)B * T, 0, V);
    tok[0] = tok[1] = tok[2] = 7; /* repeated tokens meet in one dwte row */
    pair t = pair_ints(tok, (size_t)B * T), wte = pair_rand((size_t)V * C, -1, 1), wpe = pair_rand((size_t)T * C, -1, 1);
    pair out = pair_new(NULL, (size_t)B * T * C * sizeof(float));
    g_cpu->encoder_fwd(g_cpu->ctx, C_(out), t.c, C_(wte), C_(wpe), B, T, C);
    g_gpu->encoder_fwd(g_gpu->ctx, G_(out), t.g, G_(wte), G_(wpe), B, T, C);
    compare("encoder_fwd", &out, (size_t)B * T * C, 1e-6);
    pair dout = pair_rand((size_t)B * T * C, -1, 1);
    /* wte/wpe now serve as gradients: non-zero, so accumulation is checked */
    void *wte0 = download_copy(&wte), *wpe0 = download_copy(&wpe);
    g_cpu->encoder_bwd(g_cpu->ctx, C_(wte), C_(wpe), C_(dout), t.c, B, T, C);
    g_gpu->encoder_bwd(g_gpu->ctx, G_(wte), G_(wpe), G_(dout), t.g, B, T, C);
    compare("encoder_bwd dwte (+=, repeated tokens)", &wte, (size_t)V * C, 1e-6);
    compare("encoder_bwd dwpe (+=)", &wpe, (size_t)T * C, 1e-6);
    void *first = download_copy(&wte);
    g_gpu->upload(g_gpu->ctx, wte.g, wte0, wte.bytes);
    g_gpu->upload(g_gpu->ctx, wpe.g, wpe0, wpe.bytes);
    g_gpu->encoder_bwd(g_gpu->ctx, G_(wte), G_(wpe), G_(dout), t.g, B, T, C);
    check_bitwise_same("encoder_bwd dwte", first, &wte);
    free(first);
    free(wte0);
    free(wpe0);
    free(tok);
    pair_free(&t); pair_free(&wte); pair_free(&wpe); pair_free(&out); pair_free(&dout);
}

static void test_layernorm(void) {
    const int N = g_quick ? 19 : 300, C = g_quick ? 40 : 768;
    pair inp = pair_rand((size_t)N * C, -2, 3), w = pair_rand((size_t)C, 0.5f, 1.5f), b = pair_rand((size_t)C, -1, 1);
    pair out = pair_new(NULL, (size_t)N * C * 4), mean = pair_new(NULL, (size_t)N * 4), rstd = pair_new(NULL, (size_t)N * 4);
    g_cpu->layernorm_fwd(g_cpu->ctx, C_(out), C_(mean), C_(rstd), C_(inp), C_(w), C_(b), N, C);
    g_gpu->layernorm_fwd(g_gpu->ctx, G_(out), G_(mean), G_(rstd), G_(inp), G_(w), G_(b), N, C);
    compare("layernorm_fwd out", &out, (size_t)N * C, 1e-5);
    compare("layernorm_fwd mean", &mean, (size_t)N, 1e-5);
    compare("layernorm_fwd rstd", &rstd, (size_t)N, 1e-5);
    pair dout = pair_rand((size_t)N * C, -1, 1), dinp = pair_rand((size_t)N * C, -1, 1);
    pair dw = pair_rand((size_t)C, -1, 1), db = pair_rand((size_t)C, -1, 1);
    void *dw0 = download_copy(&dw), *db0 = download_copy(&db), *dinp0 = download_copy(&dinp);
    g_cpu->layernorm_bwd(g_cpu->ctx, C_(dinp), C_(dw), C_(db), C_(dout), C_(inp), C_(w), C_(mean), C_(rstd), N, C);
    g_gpu->layernorm_bwd(g_gpu->ctx, G_(dinp), G_(dw), G_(db), G_(dout), G_(inp), G_(w), G_(mean), G_(rstd), N, C);
    compare("layernorm_bwd dinp (+=)", &dinp, (size_t)N * C, 1e-5);
    compare("layernorm_bwd dw (+=)", &dw, (size_t)C, 3e-5);
    compare("layernorm_bwd db (+=)", &db, (size_t)C, 3e-5);
    void *first = download_copy(&dw);
    g_gpu->upload(g_gpu->ctx, dw.g, dw0, dw.bytes);
    g_gpu->upload(g_gpu->ctx, db.g, db0, db.bytes);
    g_gpu->upload(g_gpu->ctx, dinp.g, dinp0, dinp.bytes);
    g_gpu->layernorm_bwd(g_gpu->ctx, G_(dinp), G_(dw), G_(db), G_(dout), G_(inp), G_(w), G_(mean), G_(rstd), N, C);
    check_bitwise_same("layernorm_bwd dw", first, &dw);
    free(first); free(dw0); free(db0); free(dinp0);
    pair_free(&inp); pair_free(&w); pair_free(&b); pair_free(&out); pair_free(&mean); pair_free(&rstd);
    pair_free(&dout); pair_free(&dinp); pair_free(&dw); pair_free(&db);
}

static void test_matmul_shape(int M, int K, int N, int w_trans, int bias, double tol) {
    char what[96];
    pair inp = pair_rand((size_t)M * K, -1, 1), w = pair_rand((size_t)K * N, -1, 1);
    pair b = pair_rand((size_t)N, -1, 1), out = pair_new(NULL, (size_t)M * N * 4);
    g_cpu->matmul_fwd(g_cpu->ctx, C_(out), C_(inp), C_(w), bias ? C_(b) : NULL, M, K, N, w_trans);
    g_gpu->matmul_fwd(g_gpu->ctx, G_(out), G_(inp), G_(w), bias ? G_(b) : NULL, M, K, N, w_trans);
    snprintf(what, sizeof what, "matmul_fwd %dx%dx%d w_trans %d%s", M, K, N, w_trans, bias ? " bias" : "");
    compare(what, &out, (size_t)M * N, tol);
    pair dout = pair_rand((size_t)M * N, -1, 1), dinp = pair_rand((size_t)M * K, -1, 1);
    pair dw = pair_rand((size_t)K * N, -1, 1), db = pair_rand((size_t)N, -1, 1);
    g_cpu->matmul_bwd(g_cpu->ctx, C_(dinp), C_(dw), bias ? C_(db) : NULL, C_(dout), C_(inp), C_(w), M, K, N, w_trans);
    g_gpu->matmul_bwd(g_gpu->ctx, G_(dinp), G_(dw), bias ? G_(db) : NULL, G_(dout), G_(inp), G_(w), M, K, N, w_trans);
    snprintf(what, sizeof what, "matmul_bwd dinp %dx%dx%d w_trans %d", M, K, N, w_trans);
    compare(what, &dinp, (size_t)M * K, tol);
    snprintf(what, sizeof what, "matmul_bwd dw (+=) %dx%dx%d w_trans %d", M, K, N, w_trans);
    compare(what, &dw, (size_t)K * N, tol);
    if (bias) {
        snprintf(what, sizeof what, "matmul_bwd dbias (+=) %dx%d", M, N);
        compare(what, &db, (size_t)N, 3e-5);
    }
    pair_free(&inp); pair_free(&w); pair_free(&b); pair_free(&out);
    pair_free(&dout); pair_free(&dinp); pair_free(&dw); pair_free(&db);
}

static void test_matmul(double tol) {
    for (int wt = 0; wt < 2; wt++) {
        test_matmul_shape(37, 29, 53, wt, 1, tol); /* odd sizes: unaligned rows */
        test_matmul_shape(64, 48, 144, wt, 0, tol);
        if (!g_quick) test_matmul_shape(1024, 768, 2304, wt, !wt, tol);
    }
}

static void test_attention(double tol) {
    const int B = 2, T = g_quick ? 13 : 80, NH = 4, C = g_quick ? 32 : 128;
    const size_t BT = (size_t)B * T, P = (size_t)B * NH * T * T;
    pair qkv = pair_rand(BT * 3 * C, -1, 1), out = pair_new(NULL, BT * C * 4), att = pair_new(NULL, P * 4);
    g_cpu->attention_fwd(g_cpu->ctx, C_(out), C_(att), C_(qkv), B, T, C, NH);
    g_gpu->attention_fwd(g_gpu->ctx, G_(out), G_(att), G_(qkv), B, T, C, NH);
    compare("attention_fwd out", &out, BT * C, tol);
    compare("attention_fwd probabilities (0 above diag)", &att, P, tol);
    /* the future really is masked: exact zeros above the diagonal */
    float *a = download_copy(&att);
    size_t nonzero = 0;
    for (size_t bh = 0; bh < (size_t)B * NH; bh++)
        for (int t = 0; t < T; t++)
            for (int u = t + 1; u < T; u++) nonzero += a[(bh * T + t) * T + u] != 0.0f;
    printf("  %-44s %zu non-zero%s\n", "attention_fwd causal mask", nonzero, nonzero ? "  FAIL" : "");
    if (nonzero) g_failures++;
    free(a);
    pair dout = pair_rand(BT * C, -1, 1), dqkv = pair_new(NULL, BT * 3 * C * 4), datt = pair_new(NULL, P * 4);
    g_cpu->attention_bwd(g_cpu->ctx, C_(dqkv), C_(datt), C_(dout), C_(qkv), C_(att), B, T, C, NH);
    g_gpu->attention_bwd(g_gpu->ctx, G_(dqkv), G_(datt), G_(dout), G_(qkv), G_(att), B, T, C, NH);
    compare("attention_bwd dqkv", &dqkv, BT * 3 * C, tol * 2);
    pair_free(&qkv); pair_free(&out); pair_free(&att); pair_free(&dout); pair_free(&dqkv); pair_free(&datt);
}

static void test_elementwise(void) {
    const size_t n = g_quick ? 1001 : 1000003;
    pair x = pair_rand(n, -4, 4), y = pair_rand(n, -1, 1), out = pair_new(NULL, n * 4);
    g_cpu->gelu_fwd(g_cpu->ctx, C_(out), C_(x), n);
    g_gpu->gelu_fwd(g_gpu->ctx, G_(out), G_(x), n);
    compare("gelu_fwd", &out, n, 1e-5);
    g_cpu->gelu_bwd(g_cpu->ctx, C_(out), C_(x), C_(y), n);
    g_gpu->gelu_bwd(g_gpu->ctx, G_(out), G_(x), G_(y), n);
    compare("gelu_bwd", &out, n, 1e-5);
    g_cpu->add(g_cpu->ctx, C_(out), C_(x), C_(y), n);
    g_gpu->add(g_gpu->ctx, G_(out), G_(x), G_(y), n);
    compare("add", &out, n, 1e-7);
    g_cpu->add(g_cpu->ctx, C_(x), C_(x), C_(y), n); /* out aliasing a */
    g_gpu->add(g_gpu->ctx, G_(x), G_(x), G_(y), n);
    compare("add in place", &x, n, 1e-7);
    g_cpu->scale(g_cpu->ctx, C_(x), n, -0.37f);
    g_gpu->scale(g_gpu->ctx, G_(x), n, -0.37f);
    compare("scale", &x, n, 1e-7);
    double sc = g_cpu->sumsq(g_cpu->ctx, C_(x), n), sg = g_gpu->sumsq(g_gpu->ctx, G_(x), n);
    double sg2 = g_gpu->sumsq(g_gpu->ctx, G_(x), n);
    gpu_ok();
    int ok = fabs(sc - sg) <= 1e-9 * fabs(sc) && sg == sg2;
    printf("  %-44s cpu %.15g gpu %.15g%s\n", "sumsq (double, deterministic)", sc, sg, ok ? "" : "  FAIL");
    if (!ok) g_failures++;
    pair_free(&x); pair_free(&y); pair_free(&out);
}

static void test_xent(int N, int V) {
    char what[80];
    int *tg = rand_ints((size_t)N, 0, V);
    tg[1 % N] = -1; /* an ignored row */
    pair t = pair_ints(tg, (size_t)N), logits = pair_rand((size_t)N * V, -6, 6), losses = pair_new(NULL, (size_t)N * 4);
    g_cpu->xent_fwd(g_cpu->ctx, C_(losses), C_(logits), C_(logits), t.c, N, V); /* probs in place, as the model does */
    g_gpu->xent_fwd(g_gpu->ctx, G_(losses), G_(logits), G_(logits), t.g, N, V);
    snprintf(what, sizeof what, "xent_fwd losses %dx%d", N, V);
    compare(what, &losses, (size_t)N, 1e-5);
    snprintf(what, sizeof what, "xent_fwd probs (in place) %dx%d", N, V);
    compare(what, &logits, (size_t)N * V, 1e-5);
    pair idx = pair_new(NULL, (size_t)N * sizeof(int));
    g_cpu->argmax(g_cpu->ctx, idx.c, C_(logits), N, V);
    g_gpu->argmax(g_gpu->ctx, idx.g, G_(logits), N, V);
    snprintf(what, sizeof what, "argmax %dx%d", N, V);
    compare_ints(what, &idx, (size_t)N);
    g_cpu->xent_bwd(g_cpu->ctx, C_(logits), C_(logits), t.c, 0.25f, N, V);
    g_gpu->xent_bwd(g_gpu->ctx, G_(logits), G_(logits), t.g, 0.25f, N, V);
    snprintf(what, sizeof what, "xent_bwd (in place, ignored row) %dx%d", N, V);
    compare(what, &logits, (size_t)N * V, 1e-5);
    free(tg);
    pair_free(&t); pair_free(&logits); pair_free(&losses); pair_free(&idx);
}

static void test_rows(void) {
    const int n = 6, C = 40, R = 9;
    int rows[6] = {3, 0, 8, 3, 5, 3}; /* duplicates accumulate in order */
    pair r = pair_ints(rows, (size_t)n), x = pair_rand((size_t)R * C, -1, 1), out = pair_new(NULL, (size_t)n * C * 4);
    g_cpu->gather_rows(g_cpu->ctx, C_(out), C_(x), r.c, n, C);
    g_gpu->gather_rows(g_gpu->ctx, G_(out), G_(x), r.g, n, C);
    compare("gather_rows", &out, (size_t)n * C, 0);
    g_cpu->scatter_add_rows(g_cpu->ctx, C_(x), C_(out), r.c, n, C);
    g_gpu->scatter_add_rows(g_gpu->ctx, G_(x), G_(out), r.g, n, C);
    compare("scatter_add_rows (+=, duplicate rows)", &x, (size_t)R * C, 1e-7);
    pair_free(&r); pair_free(&x); pair_free(&out);
}

static void test_adamw(void) {
    const size_t n = g_quick ? 999 : 300007;
    pair p = pair_rand(n, -1, 1), g = pair_rand(n, -1, 1), m = pair_rand(n, -0.1f, 0.1f), v = pair_rand(n, 0, 0.01f);
    for (int t = 1; t <= 3; t++) {
        g_cpu->adamw(g_cpu->ctx, C_(p), C_(g), C_(m), C_(v), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        g_gpu->adamw(g_gpu->ctx, G_(p), G_(g), G_(m), G_(v), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    }
    compare("adamw params (3 steps)", &p, n, 1e-6);
    compare("adamw first moment", &m, n, 1e-6);
    compare("adamw second moment", &v, n, 1e-6);
    pair_free(&p); pair_free(&g); pair_free(&m); pair_free(&v);
}

/* ---- the whole model ---- */

static void test_model(int num_labels, double tol) {
    dt_model_cfg mc = {.vocab_size = num_labels ? 260 : 67, .n_positions = 24, .n_layer = 2, .n_head = 4, .n_embd = 32,
                       .num_labels = num_labels, .seq_len = 16, .max_batch = 3, .seed = 1234};
    dt_model *mcpu = NULL, *mgpu = NULL;
    CHECK(dt_model_init(&mcpu, &mc, g_cpu) == DT_OK);
    if (dt_model_init(&mgpu, &mc, g_gpu) != DT_OK) {
        fprintf(stderr, "%s\n", dt_error_msg());
        exit(1);
    }
    const int B = 3, T = mc.seq_len;
    int *tok = rand_ints((size_t)B * T, 1, mc.vocab_size);
    int *tg = num_labels ? rand_ints((size_t)B, 0, num_labels) : rand_ints((size_t)B * T, 0, mc.vocab_size);
    if (!num_labels) tg[5] = -1;
    dt_fwd_result rc, rg;
    CHECK(dt_model_forward(mcpu, tok, tg, B, &rc) == DT_OK);
    if (dt_model_forward(mgpu, tok, tg, B, &rg) != DT_OK) {
        fprintf(stderr, "%s\n", dt_error_msg());
        exit(1);
    }
    double lc = rc.loss_sum / (double)rc.rows, lg = rg.loss_sum / (double)rg.rows;
    int ok = fabs(lc - lg) <= tol * fabs(lc) && rc.rows == rg.rows;
    printf("  model (%s) loss: cpu %.7f gpu %.7f%s\n", num_labels ? "classification" : "LM", lc, lg, ok ? "" : "  FAIL");
    if (!ok) g_failures++;
    CHECK(dt_model_backward(mcpu, 1.0f / (float)rc.rows, NULL, NULL) == DT_OK);
    CHECK(dt_model_backward(mgpu, 1.0f / (float)rg.rows, NULL, NULL) == DT_OK);
    gpu_ok();
    size_t n = dt_model_num_params(mcpu);
    pair grads = {dt_model_grads(mcpu), dt_model_grads(mgpu), n * sizeof(float)};
    /* per tensor: one that is wrong cannot hide in the total */
    float *g = malloc(n * sizeof(float));
    CHECK(g);
    g_gpu->download(g_gpu->ctx, g, grads.g, n * sizeof(float));
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < dt_model_num_tensors(mcpu); i++) {
        const dt_tensor_info *t = dt_model_tensor(mcpu, i);
        const float *c = (const float *)grads.c + t->offset;
        double num = 0, den = 0;
        for (size_t k = 0; k < t->numel; k++) {
            double d = (double)g[t->offset + k] - c[k];
            num += d * d;
            den += (double)c[k] * c[k];
        }
        if (den == 0 && num == 0) continue; /* e.g. wte rows of tokens never seen */
        double rel = sqrt(num) / fmax(sqrt(den), 1e-30);
        if (rel > worst) { worst = rel; worst_name = t->name; }
    }
    ok = worst <= tol;
    printf("  model (%s) gradients: worst tensor %s rel L2 %.3e (tol %.0e)%s\n", num_labels ? "classification" : "LM",
           worst_name, worst, tol, ok ? "" : "  FAIL");
    if (!ok) g_failures++;
    free(g);
    free(tok);
    free(tg);
    dt_model_free(mcpu);
    dt_model_free(mgpu);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) g_quick |= strcmp(argv[i], "--quick") == 0;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        printf("no usable GPU: skipped\n");
        return 77;
    }
    CHECK(dt_ops_cpu_init(&g_cpu, 0) == DT_OK);
    for (int bf16 = 0; bf16 < 2; bf16++) {
        if (dt_ops_cuda_init(&g_gpu, 0, bf16, 0) != DT_OK) {
            fprintf(stderr, "%s\n", dt_error_msg());
            return 1;
        }
        printf("%s%s:\n", bf16 ? "bf16 products" : "fp32", g_quick ? " (quick)" : "");
        if (!bf16) { /* these ops have no bf16 path: test them once */
            test_encoder();
            test_layernorm();
            test_elementwise();
            test_xent(7, 11);
            test_xent(g_quick ? 5 : 64, g_quick ? 300 : 50257);
            test_rows();
            test_adamw();
        }
        test_matmul(bf16 ? 1e-2 : 1e-5);
        test_attention(bf16 ? 1e-2 : 1e-5);
        test_model(0, bf16 ? 5e-2 : 1e-4);
        test_model(2, bf16 ? 5e-2 : 1e-4);
        dt_ops_cuda_free(g_gpu);
        g_gpu = NULL;
    }
    dt_ops_cpu_free(g_cpu);
    if (g_failures) {
        fprintf(stderr, "test_ops_cuda: %d comparison(s) failed\n", g_failures);
        return 1;
    }
    printf("test_ops_cuda: all ops match the CPU backend\n");
    return 0;
}
