/* test_ops_cuda.c — (label gpu) every op of the CUDA backend against the CPU backend, the
 * reference, on fresh random inputs; then the whole model's loss and gradients, CPU vs GPU.
 * Skips (77) without a usable GPU. `--quick` uses smaller shapes (for compute-sanitizer).
 * Besides realistic shapes, edge cases: sizes of 1, odd widths (unaligned rows, and biases
 * inside the parameter buffer that are only 4-byte aligned), empty inputs, a layernorm row whose
 * mean dwarfs its spread, NaN, -inf and ties in argmax, the NULL gradients ops.h allows.
 * Without a GPU, ctest's test_cuda_mock runs this file on CPU mocks (tests/mockgpu).
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
#include "dtrain/optim.h"

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
/* n multiples of 1/64 in [-1, 1]: exact in bf16, so a sum of a few products of them is exact
 * in fp32 too */
static pair pair_grid(size_t n) {
    float *h = rand_host(n, -1, 1);
    for (size_t i = 0; i < n; i++) h[i] = roundf(h[i] * 64) / 64;
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

static void test_encoder(int B, int T, int C, int V) {
    int *tok = rand_ints((size_t)B * T, 0, V);
    if (B * T >= 3) tok[0] = tok[1] = tok[2] = V - 1; /* repeated tokens meet in one dwte row */
    pair t = pair_ints(tok, (size_t)B * T), wte = pair_rand((size_t)V * C, -1, 1), wpe = pair_rand((size_t)T * C, -1, 1);
    pair out = pair_new(NULL, (size_t)B * T * C * sizeof(float));
    printf("  encoder B %d T %d C %d V %d:\n", B, T, C, V);
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

/* inputs in [lo, hi): lo = 100, hi = 101 gives rows whose mean is 200x their spread */
static void test_layernorm(int N, int C, float lo, float hi) {
    pair inp = pair_rand((size_t)N * C, lo, hi), w = pair_rand((size_t)C, 0.5f, 1.5f), b = pair_rand((size_t)C, -1, 1);
    pair out = pair_new(NULL, (size_t)N * C * 4), mean = pair_new(NULL, (size_t)N * 4), rstd = pair_new(NULL, (size_t)N * 4);
    printf("  layernorm N %d C %d, inputs in [%g, %g):\n", N, C, lo, hi);
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

/* bias: 0 none, 1 a vector of its own, 2 one float into its buffer (4-byte aligned, as biases
 * inside the parameter buffer can be); the bias gradient likewise. Tiny shapes multiply
 * pair_grid values, exact in bf16: over a few terms one bf16 rounding is not averaged out, and
 * a bias or gradient of similar size could cancel most of the result. */
static void test_matmul_shape(int M, int K, int N, int w_trans, int bias, double tol) {
    char what[96];
    const int off = bias == 2, tiny = M * K * N < 1000;
    pair inp = tiny ? pair_grid((size_t)M * K) : pair_rand((size_t)M * K, -1, 1);
    pair w = tiny ? pair_grid((size_t)K * N) : pair_rand((size_t)K * N, -1, 1);
    pair b = pair_rand((size_t)N + 1, -1, 1), out = pair_new(NULL, (size_t)M * N * 4);
    g_cpu->matmul_fwd(g_cpu->ctx, C_(out), C_(inp), C_(w), bias ? C_(b) + off : NULL, M, K, N, w_trans);
    g_gpu->matmul_fwd(g_gpu->ctx, G_(out), G_(inp), G_(w), bias ? G_(b) + off : NULL, M, K, N, w_trans);
    snprintf(what, sizeof what, "matmul_fwd %dx%dx%d w_trans %d%s", M, K, N, w_trans,
             bias == 2 ? " bias (4-byte aligned)" : bias ? " bias" : "");
    compare(what, &out, (size_t)M * N, tol);
    pair dout = tiny ? pair_grid((size_t)M * N) : pair_rand((size_t)M * N, -1, 1);
    pair dinp = pair_rand((size_t)M * K, -1, 1), dw = pair_rand((size_t)K * N, -1, 1), db = pair_rand((size_t)N + 1, -1, 1);
    g_cpu->matmul_bwd(g_cpu->ctx, C_(dinp), C_(dw), bias ? C_(db) + off : NULL, C_(dout), C_(inp), C_(w), M, K, N, w_trans);
    g_gpu->matmul_bwd(g_gpu->ctx, G_(dinp), G_(dw), bias ? G_(db) + off : NULL, G_(dout), G_(inp), G_(w), M, K, N, w_trans);
    snprintf(what, sizeof what, "matmul_bwd dinp %dx%dx%d w_trans %d", M, K, N, w_trans);
    compare(what, &dinp, (size_t)M * K, tol);
    snprintf(what, sizeof what, "matmul_bwd dw (+=) %dx%dx%d w_trans %d", M, K, N, w_trans);
    compare(what, &dw, (size_t)K * N, tol);
    if (bias) {
        snprintf(what, sizeof what, "matmul_bwd dbias (+=) %dx%d", M, N);
        compare(what, &db, (size_t)N + 1, 3e-5);
    }
    /* what ops.h lets a caller skip: dinp (the first layer's input), dw (frozen weights); the
     * paths do not depend on the size, so not for the largest shape */
    if ((size_t)M * K * N < ((size_t)1 << 24)) {
        g_cpu->matmul_bwd(g_cpu->ctx, NULL, C_(dw), NULL, C_(dout), C_(inp), C_(w), M, K, N, w_trans);
        g_gpu->matmul_bwd(g_gpu->ctx, NULL, G_(dw), NULL, G_(dout), G_(inp), G_(w), M, K, N, w_trans);
        g_cpu->matmul_bwd(g_cpu->ctx, C_(dinp), NULL, NULL, C_(dout), C_(inp), C_(w), M, K, N, w_trans);
        g_gpu->matmul_bwd(g_gpu->ctx, G_(dinp), NULL, NULL, G_(dout), G_(inp), G_(w), M, K, N, w_trans);
        snprintf(what, sizeof what, "matmul_bwd dw (+=), dinp NULL %dx%dx%d", M, K, N);
        compare(what, &dw, (size_t)K * N, tol);
        snprintf(what, sizeof what, "matmul_bwd dinp, dw NULL %dx%dx%d", M, K, N);
        compare(what, &dinp, (size_t)M * K, tol);
    }
    pair_free(&inp); pair_free(&w); pair_free(&b); pair_free(&out);
    pair_free(&dout); pair_free(&dinp); pair_free(&dw); pair_free(&db);
}

static void test_matmul(double tol) {
    for (int wt = 0; wt < 2; wt++) {
        test_matmul_shape(37, 29, 53, wt, 1, tol); /* odd sizes: unaligned rows */
        test_matmul_shape(64, 48, 144, wt, 0, tol);
        test_matmul_shape(130, 70, 6, wt, 2, tol);
        test_matmul_shape(1, 1, 1, wt, 1, tol);
        test_matmul_shape(1, 7, 3, wt, 2, tol);
        test_matmul_shape(5, 1, 9, wt, 1, tol);
        test_matmul_shape(3, 9, 1, wt, 2, tol);
        if (!g_quick) test_matmul_shape(1024, 768, 2304, wt, !wt, tol);
    }
}

static void test_attention(int B, int T, int C, int NH, double tol) {
    const size_t BT = (size_t)B * T, P = (size_t)B * NH * T * T;
    pair qkv = pair_rand(BT * 3 * C, -1, 1), out = pair_new(NULL, BT * C * 4), att = pair_new(NULL, P * 4);
    printf("  attention B %d T %d C %d NH %d:\n", B, T, C, NH);
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

static void test_elementwise(size_t n) {
    pair x = pair_rand(n, -4, 4), y = pair_rand(n, -1, 1), out = pair_new(NULL, n * 4);
    printf("  element-wise n %zu:\n", n);
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

/* out(n, C) = x(R, C)[rows] and back */
static void test_rows(const int *rows, int n, int C, int R) {
    pair r = pair_ints(rows, (size_t)n), x = pair_rand((size_t)R * C, -1, 1), out = pair_new(NULL, (size_t)n * C * 4);
    printf("  rows n %d C %d of %d:\n", n, C, R);
    g_cpu->gather_rows(g_cpu->ctx, C_(out), C_(x), r.c, n, C);
    g_gpu->gather_rows(g_gpu->ctx, G_(out), G_(x), r.g, n, C);
    compare("gather_rows", &out, (size_t)n * C, 0);
    g_cpu->scatter_add_rows(g_cpu->ctx, C_(x), C_(out), r.c, n, C);
    g_gpu->scatter_add_rows(g_gpu->ctx, G_(x), G_(out), r.g, n, C);
    compare("scatter_add_rows (+=)", &x, (size_t)R * C, 1e-7);
    pair_free(&r); pair_free(&x); pair_free(&out);
}

static void test_adamw(size_t n) {
    pair p = pair_rand(n, -1, 1), g = pair_rand(n, -1, 1), m = pair_rand(n, -0.1f, 0.1f), v = pair_rand(n, 0, 0.01f);
    printf("  adamw n %zu:\n", n);
    for (int t = 1; t <= 3; t++) {
        g_cpu->adamw(g_cpu->ctx, C_(p), C_(g), C_(m), C_(v), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        g_gpu->adamw(g_gpu->ctx, G_(p), G_(g), G_(m), G_(v), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    }
    compare("adamw params (3 steps)", &p, n, 1e-6);
    compare("adamw first moment", &m, n, 1e-6);
    compare("adamw second moment", &v, n, 1e-6);
    pair_free(&p); pair_free(&g); pair_free(&m); pair_free(&v);
}

/* argmax on rows the softmax never produces: ties, -inf, NaN; the CPU's answer is the
 * reference (the first maximum; NaNs never compare greater, so a NaN in column 0 wins) */
static void test_argmax_special(void) {
    enum { N = 6, V = 300 };
    static const char *rows[N] = {"all tied", "all -inf", "a tie across threads", "NaN at column 0", "NaN elsewhere",
                                  "all NaN"};
    float *h = rand_host((size_t)N * V, 0, 1);
    for (int k = 0; k < V; k++) {
        h[0 * V + k] = 0.5f;
        h[1 * V + k] = -INFINITY;
        h[5 * V + k] = NAN;
    }
    h[2 * V + 7] = h[2 * V + 263] = 2.0f;
    h[3 * V + 0] = NAN;
    h[4 * V + 5] = NAN;
    h[4 * V + 100] = 9.0f;
    pair x = pair_new(h, sizeof(float) * N * V), idx = pair_new(NULL, N * sizeof(int));
    g_cpu->argmax(g_cpu->ctx, idx.c, C_(x), N, V);
    g_gpu->argmax(g_gpu->ctx, idx.g, G_(x), N, V);
    gpu_ok();
    int g[N];
    g_gpu->download(g_gpu->ctx, g, idx.g, sizeof g);
    gpu_ok();
    for (int i = 0; i < N; i++) {
        const int c = ((const int *)idx.c)[i];
        printf("  argmax, %-37s cpu %d gpu %d%s\n", rows[i], c, g[i], g[i] == c ? "" : "  FAIL");
        if (g[i] != c) g_failures++;
    }
    free(h);
    pair_free(&x); pair_free(&idx);
}

/* ---- the whole model ---- */

/* A model of V tokens, L layers, NH heads, width C on B sequences of T tokens: a classifier of
 * num_labels classes, or a language model (num_labels 0). An odd C puts most biases of the
 * parameter buffer at 4-byte alignment. */
static void test_model(int V, int L, int NH, int C, int T, int B, int num_labels, double tol) {
    dt_model_cfg mc = {.vocab_size = V, .n_positions = T + 8, .n_layer = L, .n_head = NH, .n_embd = C,
                       .num_labels = num_labels, .seq_len = T, .max_batch = B, .seed = 1234};
    dt_model *mcpu = NULL, *mgpu = NULL;
    CHECK(dt_model_init(&mcpu, &mc, g_cpu) == DT_OK);
    if (dt_model_init(&mgpu, &mc, g_gpu) != DT_OK) {
        fprintf(stderr, "%s\n", dt_error_msg());
        exit(1);
    }
    int *tok = rand_ints((size_t)B * T, 1, V);
    int *tg = num_labels ? rand_ints((size_t)B, 0, num_labels) : rand_ints((size_t)B * T, 0, V);
    if (!num_labels && B * T > 1) tg[B * T / 2] = -1; /* an ignored position */
    printf("  model V %d L %d NH %d C %d T %d B %d (%s):\n", V, L, NH, C, T, B,
           num_labels ? "classification" : "LM");
    dt_fwd_result rc, rg;
    CHECK(dt_model_forward(mcpu, tok, tg, B, &rc) == DT_OK);
    if (dt_model_forward(mgpu, tok, tg, B, &rg) != DT_OK) {
        fprintf(stderr, "%s\n", dt_error_msg());
        exit(1);
    }
    double lc = rc.loss_sum / (double)rc.rows, lg = rg.loss_sum / (double)rg.rows;
    int ok = fabs(lc - lg) <= tol * fabs(lc) && rc.rows == rg.rows;
    printf("  loss: cpu %.7f gpu %.7f%s\n", lc, lg, ok ? "" : "  FAIL");
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
    /* a tensor's error relative to its own norm, floored at a tenth of the largest tensor's:
     * rounding errors scale with the magnitudes that enter a sum, so a small gradient that is
     * the cancellation of large terms (ln_f.bias of a tiny classifier in bf16) carries the
     * error of those terms; a wrong index is an O(1) error either way */
    double largest = 0;
    for (int i = 0; i < dt_model_num_tensors(mcpu); i++) {
        const dt_tensor_info *t = dt_model_tensor(mcpu, i);
        const float *c = (const float *)grads.c + t->offset;
        double den = 0;
        for (size_t k = 0; k < t->numel; k++) den += (double)c[k] * c[k];
        largest = fmax(largest, sqrt(den));
    }
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
        double rel = sqrt(num) / fmax(fmax(sqrt(den), 0.1 * largest), 1e-30);
        if (rel > worst) { worst = rel; worst_name = t->name; }
    }
    ok = worst <= tol;
    printf("  gradients: worst tensor %s rel L2 %.3e (tol %.0e)%s\n", worst_name, worst, tol, ok ? "" : "  FAIL");
    if (!ok) g_failures++;
    free(g);
    free(tok);
    free(tg);
    dt_model_free(mcpu);
    dt_model_free(mgpu);
}

/* A few optimizer steps on both backends: after each AdamW update the next forward reads the
 * weights again (on the GPU in bf16: the working copy the AdamW kernel rewrote in the same
 * pass), so a stale or misplaced copy shows up as a different loss. */
static void test_training_steps(double tol) {
    dt_model_cfg mc = {.vocab_size = 67, .n_positions = 24, .n_layer = 2, .n_head = 4, .n_embd = 32,
                       .num_labels = 0, .seq_len = 16, .max_batch = 3, .seed = 99};
    dt_model *mod[2] = {NULL, NULL};
    dt_optim *opt[2] = {NULL, NULL};
    dt_ops *ops[2] = {g_cpu, g_gpu};
    dt_optim_cfg oc = {.lr = 1e-2, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0,
                       .schedule = DT_SCHED_CONSTANT, .warmup_steps = 0, .total_steps = 10, .min_lr_ratio = 0.1};
    for (int k = 0; k < 2; k++) {
        if (dt_model_init(&mod[k], &mc, ops[k]) != DT_OK) {
            fprintf(stderr, "%s\n", dt_error_msg());
            exit(1);
        }
        int nt = dt_model_num_tensors(mod[k]);
        dt_param_seg *segs = calloc((size_t)nt, sizeof *segs);
        CHECK(segs);
        for (int i = 0; i < nt; i++) {
            const dt_tensor_info *t = dt_model_tensor(mod[k], i);
            segs[i] = (dt_param_seg){t->offset, t->numel, t->ndim >= 2};
        }
        CHECK(dt_optim_init(&opt[k], &oc, ops[k], dt_model_num_params(mod[k]), segs, nt) == DT_OK);
        free(segs);
    }
    const int B = 3, T = mc.seq_len;
    int *tok = rand_ints((size_t)B * T, 0, mc.vocab_size), *tg = rand_ints((size_t)B * T, 0, mc.vocab_size);
    double worst = 0;
    for (int step = 0; step < 4; step++) {
        double loss[2];
        for (int k = 0; k < 2; k++) {
            dt_fwd_result r;
            dt_model_zero_grad(mod[k]);
            double gn, lr;
            if (dt_model_forward(mod[k], tok, tg, B, &r) != DT_OK ||
                dt_model_backward(mod[k], 1.0f / (float)r.rows, NULL, NULL) != DT_OK ||
                dt_optim_step(opt[k], dt_model_params(mod[k]), dt_model_grads(mod[k]), step, &gn, &lr) != DT_OK) {
                fprintf(stderr, "%s\n", dt_error_msg());
                exit(1);
            }
            loss[k] = r.loss_sum / (double)r.rows;
        }
        double rel = fabs(loss[1] - loss[0]) / fabs(loss[0]);
        if (rel > worst) worst = rel;
        printf("  training step %d: loss cpu %.7f gpu %.7f\n", step + 1, loss[0], loss[1]);
    }
    int ok = worst <= tol;
    printf("  %-44s worst rel %.3e (tol %.0e)%s\n", "losses over 4 AdamW steps", worst, tol, ok ? "" : "  FAIL");
    if (!ok) g_failures++;
    free(tok);
    free(tg);
    for (int k = 0; k < 2; k++) {
        dt_optim_free(opt[k]);
        dt_model_free(mod[k]);
    }
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
            test_encoder(3, g_quick ? 17 : 64, g_quick ? 24 : 96, 50);
            test_encoder(1, 1, 1, 2);
            test_encoder(2, 5, 257, 3); /* C over one block of threads, few tokens: long runs */
            test_layernorm(g_quick ? 19 : 300, g_quick ? 40 : 768, -2, 3);
            test_layernorm(1, 1, -1, 1);
            test_layernorm(3, 31, 100, 101);
            test_layernorm(g_quick ? 1000 : 33000, 3, -1, 1); /* full: over 1024 groups of 32 rows */
            test_layernorm(5, 2000, -1, 1);
            test_elementwise(g_quick ? 1001 : 1000003);
            test_elementwise(1);
            test_xent(7, 11);
            test_xent(g_quick ? 5 : 64, g_quick ? 300 : 50257);
            test_xent(1, 1);
            test_xent(3, 2);
            test_xent(4, 513);
            test_argmax_special();
            test_rows((const int[]){3, 0, 8, 3, 5, 3}, 6, 40, 9); /* duplicates accumulate in order */
            test_rows((const int[]){0}, 1, 1, 1);
            test_rows(NULL, 0, 5, 3);
            test_adamw(g_quick ? 999 : 300007);
            test_adamw(1);
        }
        const double tol = bf16 ? 1e-2 : 1e-5, model_tol = bf16 ? 5e-2 : 1e-4;
        test_matmul(tol);
        test_attention(2, g_quick ? 13 : 80, g_quick ? 32 : 128, 4, tol);
        test_attention(1, 1, 4, 2, tol);
        test_attention(2, 33, 6, 3, tol);
        test_attention(1, 40, 5, 5, tol); /* head size 1 */
        test_attention(3, 70, 12, 1, tol);
        test_model(67, 2, 4, 32, 16, 3, 0, model_tol);
        test_model(260, 2, 4, 32, 16, 3, 2, model_tol);
        test_model(7, 1, 2, 6, 5, 2, 0, model_tol);
        test_model(11, 1, 3, 12, 9, 3, 3, model_tol);
        test_model(50, 2, 4, 36, 33, 2, 0, model_tol);
        test_model(30, 1, 1, 8, 1, 1, 0, model_tol); /* one token */
        test_training_steps(bf16 ? 5e-3 : 1e-5);
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
