/* test_ops_cpu.c — the CPU op table (src/ops/ops_cpu.c) against independent references.
 *
 * Forward be are compared with naive double-precision loops written here. Every backward
 * is compared with central finite differences of its forward: L = sum(out .* R) for a
 * fixed random R, accumulated in double; dL/dx[i] ~ (L(x+eps) - L(x-eps)) / (2 eps), with
 * the actually representable step used as the denominator. Gradients that the op table
 * ACCUMULATES are checked as (result - prefill) on buffers prefilled with random values;
 * gradients it OVERWRITES are prefilled with garbage (1e30) first.
 *
 * Tolerances:
 *   finite differences: eps = 1e-2 (2e-2 for attention with T >= 80), and
 *     |analytic - fd| <= 1e-2 * max(|a|, |fd|, 1e-2): relative 1e-2, absolute floor 1e-4.
 *     The float forward's rounding contributes ~1e-5 to fd and the O(eps^2) truncation of
 *     smooth be (gelu, softmax, layernorm) ~1e-4 relative; a wrong index or a missing
 *     term gives errors of order 1e-1 and more (worst observed: 0.2 of the bound).
 *   forwards vs double references: relative 1e-5 with absolute floor 1 for dot products
 *     (abs 1e-5 at unit scale), 1e-5 relative for elementwise results (gelu: absolute
 *     floor 5e-7, the reference's 1 + tanh cancels for x << 0); layernorm backward at the
 *     large size vs its analytic formula in double: 1e-4 with floor 1;
 *   AdamW: relative 1e-5 (floors 1e-2 for p and 1e-3 for m, which may cancel); sumsq: 1e-12,
 *     and the bits of the scalar definitions (test_optimizer_bits).
 * Determinism checks are bit-exact (memcmp). */
#include "check.h"
#include "dtrain/backend.h"
#include "dtrain/bf16.h"

#include <stdint.h>

/* the CPU backend's activations are floats: test buffers pass as they are */
#define A(p) ((dt_act *)(p))

#define FD_EPS 1e-2f
#define FD_TOL 1e-2
#define FD_FLOOR 1e-2
#define GARBAGE 1e30f

static dt_backend *be;

/* ---- helpers ---- */

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnext(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float frand(void) { return (float)((rnext() >> 8) * (1.0 / 16777216.0) * 2.0 - 1.0); }
static int irand(int n) { return (int)(rnext() % (uint32_t)n); }

static void *balloc(size_t bytes) {
    void *p = NULL;
    CHECK_INT_EQ(be->ops->alloc(be->ctx, bytes, "test buffer", &p), DT_OK);
    CHECK(p != NULL);
    return p;
}
static float *falloc(size_t n) { return balloc(n * sizeof(float)); }
static int *ialloc(size_t n) { return balloc(n * sizeof(int)); }
static void bfree(void *p) { be->ops->free(be->ctx, p); }

static float *frandom(size_t n, float amp) {
    float *x = falloc(n);
    for (size_t i = 0; i < n; i++) x[i] = amp * frand();
    return x;
}
static void ffill(float *x, size_t n, float v) {
    for (size_t i = 0; i < n; i++) x[i] = v;
}
static float *fcopy(const float *x, size_t n) {
    float *y = falloc(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}
static double dot_d(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}
/* out[i] = a[i] - b[i] (recovers an accumulated gradient from its prefill) */
static float *fdiff(const float *a, const float *b, size_t n) {
    float *d = falloc(n);
    for (size_t i = 0; i < n; i++) d[i] = a[i] - b[i];
    return d;
}

typedef double (*loss_fn)(void *state);

/* Compares grad[i] with the central difference of f at x[i], for all i (n <= max_checks)
 * or max_checks random i. */
static void fd_check_eps(const char *what, loss_fn f, void *state, float *x, const float *grad,
                         size_t n, size_t max_checks, float eps) {
    const size_t count = n < max_checks ? n : max_checks;
    for (size_t k = 0; k < count; k++) {
        const size_t i = n <= max_checks ? k : (size_t)irand((int)n);
        const float x0 = x[i], xp = x0 + eps, xm = x0 - eps;
        x[i] = xp;
        const double lp = f(state);
        x[i] = xm;
        const double lm = f(state);
        x[i] = x0;
        const double fd = (lp - lm) / ((double)xp - (double)xm), a = grad[i];
        if (!(fabs(a - fd) <= FD_TOL * fmax(fmax(fabs(a), fabs(fd)), FD_FLOOR)))
            fprintf(stderr, "gradient check %s[%zu]: analytic %.7g, finite difference %.7g\n", what,
                    i, a, fd);
        CHECK_NEAR_REL(a, fd, FD_TOL, FD_FLOOR);
    }
}

static void fd_check(const char *what, loss_fn f, void *state, float *x, const float *grad,
                     size_t n, size_t max_checks) {
    fd_check_eps(what, f, state, x, grad, n, max_checks, FD_EPS);
}

static void check_overwritten(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) CHECK(fabsf(x[i]) < 1e20f);
}

/* ---- memory ---- */

static void test_memory(void) {
    for (size_t bytes = 0; bytes < 300; bytes += 37) {
        unsigned char *p = balloc(bytes);
        CHECK_INT_EQ((uintptr_t)p % 64, 0);
        for (size_t i = 0; i < bytes; i++) CHECK_INT_EQ(p[i], 0);
        bfree(p);
    }
    be->ops->free(be->ctx, NULL);

    void *p = (void *)1;
    const size_t huge = (size_t)1 << 62;
    CHECK_INT_EQ(be->ops->alloc(be->ctx, huge, "giant activations", &p), DT_ERR_NOMEM);
    CHECK(p == NULL);
    CHECK_STR_CONTAINS(dt_error_msg(), "giant activations");
    CHECK_STR_CONTAINS(dt_error_msg(), "4611686018427387904");
    CHECK_INT_EQ(be->ops->alloc(be->ctx, SIZE_MAX, "overflowing buffer", &p), DT_ERR_NOMEM);
    CHECK_STR_CONTAINS(dt_error_msg(), "overflowing buffer");

    float host[10], back[10];
    for (int i = 0; i < 10; i++) host[i] = (float)i + 0.5f;
    float *d = falloc(10);
    be->ops->upload(be->ctx, d, host, sizeof host);
    be->ops->download(be->ctx, back, d, sizeof back);
    CHECK(memcmp(host, back, sizeof host) == 0);
    be->ops->zero(be->ctx, d, 4 * sizeof(float));
    for (int i = 0; i < 10; i++) CHECK(d[i] == (i < 4 ? 0.0f : host[i]));
    bfree(d);
}

/* ---- encoder ---- */

typedef struct {
    int B, T, C;
    float *out, *wte, *wpe, *R;
    int *tok;
} enc_state;

static double enc_loss(void *s_) {
    enc_state *s = s_;
    be->ops->encoder_fwd(be->ctx, A(s->out), s->tok, NULL, s->wte, s->wpe, s->B, s->T, s->C);
    return dot_d(s->out, s->R, (size_t)s->B * s->T * s->C);
}

static void test_encoder(void) {
    enc_state s = {.B = 2, .T = 3, .C = 4};
    const int V = 5, tokens[6] = {1, 3, 1, 1, 0, 3}; /* 1 three times, 3 twice */
    const size_t n = (size_t)s.B * s.T * s.C;
    s.tok = ialloc(6);
    memcpy(s.tok, tokens, sizeof tokens);
    s.wte = frandom((size_t)V * s.C, 1.0f);
    s.wpe = frandom((size_t)s.T * s.C, 1.0f);
    s.out = falloc(n);
    s.R = frandom(n, 1.0f);

    enc_loss(&s);
    for (int bt = 0; bt < s.B * s.T; bt++)
        for (int c = 0; c < s.C; c++)
            CHECK(s.out[bt * s.C + c] == s.wte[tokens[bt] * s.C + c] + s.wpe[(bt % s.T) * s.C + c]);

    float *pte = frandom((size_t)V * s.C, 1.0f), *ppe = frandom((size_t)s.T * s.C, 1.0f);
    float *dwte = fcopy(pte, (size_t)V * s.C), *dwpe = fcopy(ppe, (size_t)s.T * s.C);
    be->ops->encoder_bwd(be->ctx, dwte, dwpe, A(s.R), s.tok, NULL, s.B, s.T, s.C);
    float *gte = fdiff(dwte, pte, (size_t)V * s.C), *gpe = fdiff(dwpe, ppe, (size_t)s.T * s.C);
    fd_check("encoder dwte", enc_loss, &s, s.wte, gte, (size_t)V * s.C, SIZE_MAX);
    fd_check("encoder dwpe", enc_loss, &s, s.wpe, gpe, (size_t)s.T * s.C, SIZE_MAX);
    /* token 2 and 4 never occur: their rows stay untouched */
    for (int c = 0; c < s.C; c++) CHECK(dwte[2 * s.C + c] == pte[2 * s.C + c]);

    /* without learned positions (the Llama family): the token rows alone, and no dwpe */
    be->ops->encoder_fwd(be->ctx, A(s.out), s.tok, NULL, s.wte, NULL, s.B, s.T, s.C);
    for (int bt = 0; bt < s.B * s.T; bt++)
        for (int c = 0; c < s.C; c++) CHECK(s.out[bt * s.C + c] == s.wte[tokens[bt] * s.C + c]);
    float *dwte2 = fcopy(pte, (size_t)V * s.C);
    be->ops->encoder_bwd(be->ctx, dwte2, NULL, A(s.R), s.tok, NULL, s.B, s.T, s.C);
    CHECK(memcmp(dwte2, dwte, (size_t)V * s.C * sizeof(float)) == 0);

    bfree(s.tok), bfree(s.wte), bfree(s.wpe), bfree(s.out), bfree(s.R);
    bfree(pte), bfree(ppe), bfree(dwte), bfree(dwpe), bfree(gte), bfree(gpe), bfree(dwte2);
}

/* Determinism: two runs agree bit for bit, and both equal the serial loop (every element
 * accumulated in token order), so the result cannot depend on the thread count. */
static void test_encoder_determinism(void) {
    const int B = 4, T = 64, C = 96, V = 7;
    const size_t n = (size_t)B * T * C;
    int *tok = ialloc((size_t)B * T);
    for (int i = 0; i < B * T; i++) tok[i] = irand(V);
    float *dout = frandom(n, 1.0f);
    float *pte = frandom((size_t)V * C, 1.0f), *ppe = frandom((size_t)T * C, 1.0f);
    float *te1 = fcopy(pte, (size_t)V * C), *pe1 = fcopy(ppe, (size_t)T * C);
    float *te2 = fcopy(pte, (size_t)V * C), *pe2 = fcopy(ppe, (size_t)T * C);
    float *te3 = fcopy(pte, (size_t)V * C), *pe3 = fcopy(ppe, (size_t)T * C);
    float *out = falloc(n); /* the forward at a size that runs in parallel */
    be->ops->encoder_fwd(be->ctx, A(out), tok, NULL, pte, ppe, B, T, C);
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < C; c++)
            CHECK(out[(size_t)bt * C + c] == pte[tok[bt] * C + c] + ppe[(bt % T) * C + c]);
    bfree(out);
    be->ops->encoder_bwd(be->ctx, te1, pe1, A(dout), tok, NULL, B, T, C);
    be->ops->encoder_bwd(be->ctx, te2, pe2, A(dout), tok, NULL, B, T, C);
    CHECK(memcmp(te1, te2, (size_t)V * C * sizeof(float)) == 0);
    CHECK(memcmp(pe1, pe2, (size_t)T * C * sizeof(float)) == 0);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++) {
                te3[tok[b * T + t] * C + c] += dout[((size_t)b * T + t) * C + c];
                pe3[t * C + c] += dout[((size_t)b * T + t) * C + c];
            }
    CHECK(memcmp(te1, te3, (size_t)V * C * sizeof(float)) == 0);
    CHECK(memcmp(pe1, pe3, (size_t)T * C * sizeof(float)) == 0);
    bfree(tok), bfree(dout), bfree(pte), bfree(ppe);
    bfree(te1), bfree(pe1), bfree(te2), bfree(pe2), bfree(te3), bfree(pe3);
}

/* ---- layernorm ---- */

typedef struct {
    int N, C;
    float *out, *mean, *rstd, *inp, *w, *b, *R;
} ln_state;

static double ln_loss(void *s_) {
    ln_state *s = s_;
    be->ops->layernorm_fwd(be->ctx, A(s->out), s->mean, s->rstd, A(s->inp), s->w, s->b, s->N, s->C);
    return dot_d(s->out, s->R, (size_t)s->N * s->C);
}

static void test_layernorm(void) {
    ln_state s = {.N = 6, .C = 10};
    const int N = s.N, C = s.C;
    const size_t n = (size_t)N * C;
    s.inp = frandom(n, 2.0f);
    for (int c = 0; c < C; c++) s.inp[c] += 5.0f; /* a row with a large mean */
    s.w = frandom(C, 1.0f);
    s.b = frandom(C, 1.0f);
    s.out = falloc(n), s.mean = falloc(N), s.rstd = falloc(N);
    s.R = frandom(n, 1.0f);

    ln_loss(&s);
    for (int i = 0; i < N; i++) {
        double m = 0, v = 0;
        for (int c = 0; c < C; c++) m += s.inp[i * C + c];
        m /= C;
        for (int c = 0; c < C; c++) v += (s.inp[i * C + c] - m) * (s.inp[i * C + c] - m);
        v /= C; /* biased */
        const double r = 1.0 / sqrt(v + 1e-5);
        CHECK_NEAR_REL(s.mean[i], m, 1e-5, 1e-5);
        CHECK_NEAR_REL(s.rstd[i], r, 1e-5, 1e-5);
        for (int c = 0; c < C; c++)
            CHECK_NEAR_REL(s.out[i * C + c], (s.inp[i * C + c] - m) * r * s.w[c] + s.b[c], 1e-5,
                           1.0);
    }

    /* backward accumulates into all three */
    float *pin = frandom(n, 1.0f), *pw = frandom(C, 1.0f), *pb = frandom(C, 1.0f);
    float *dinp = fcopy(pin, n), *dw = fcopy(pw, C), *db = fcopy(pb, C);
    be->ops->layernorm_bwd(be->ctx, A(dinp), dw, db, A(s.R), A(s.inp), s.w, s.mean, s.rstd, N, C);
    float *gin = fdiff(dinp, pin, n), *gw = fdiff(dw, pw, C), *gb = fdiff(db, pb, C);
    fd_check("layernorm dinp", ln_loss, &s, s.inp, gin, n, SIZE_MAX);
    fd_check("layernorm dw", ln_loss, &s, s.w, gw, C, SIZE_MAX);
    fd_check("layernorm db", ln_loss, &s, s.b, gb, C, SIZE_MAX);

    bfree(s.inp), bfree(s.w), bfree(s.b), bfree(s.out), bfree(s.mean), bfree(s.rstd), bfree(s.R);
    bfree(pin), bfree(pw), bfree(pb), bfree(dinp), bfree(dw), bfree(db);
    bfree(gin), bfree(gw), bfree(gb);
}

/* ---- matmul ---- */

typedef struct {
    int M, K, N, wt;
    float *out, *inp, *w, *bias, *R;
} mm_state;

static double mm_loss(void *s_) {
    mm_state *s = s_;
    be->ops->matmul_fwd(be->ctx, A(s->out), A(s->inp), s->w, s->bias, s->M, s->K, s->N, s->N, s->wt);
    return dot_d(s->out, s->R, (size_t)s->M * s->N);
}

static void mm_forward_check(int M, int K, int N, int wt, int with_bias) {
    float *inp = frandom((size_t)M * K, 1.0f), *w = frandom((size_t)K * N, 1.0f);
    float *bias = with_bias ? frandom(N, 1.0f) : NULL;
    float *out = falloc((size_t)M * N);
    ffill(out, (size_t)M * N, GARBAGE);
    be->ops->matmul_fwd(be->ctx, A(out), A(inp), w, bias, M, K, N, N, wt);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = bias ? bias[j] : 0.0;
            for (int k = 0; k < K; k++)
                s += (double)inp[i * K + k] * (wt ? w[j * K + k] : w[k * N + j]);
            CHECK_NEAR_REL(out[(size_t)i * N + j], s, 1e-5, 1.0);
        }
    bfree(inp), bfree(w), bfree(bias), bfree(out);
}

static void test_matmul(void) {
    for (int wt = 0; wt <= 1; wt++)
        for (int wb = 0; wb <= 1; wb++) {
            mm_forward_check(5, 7, 6, wt, wb);
            mm_forward_check(33, 70, 45, wt, wb);
            mm_forward_check(1, 3, 1, wt, wb);

            mm_state s = {.M = 5, .K = 7, .N = 6, .wt = wt};
            const int M = s.M, K = s.K, N = s.N;
            s.inp = frandom((size_t)M * K, 1.0f);
            s.w = frandom((size_t)K * N, 1.0f);
            s.bias = wb ? frandom(N, 1.0f) : NULL;
            s.out = falloc((size_t)M * N);
            s.R = frandom((size_t)M * N, 1.0f);
            float *dinp = falloc((size_t)M * K);
            ffill(dinp, (size_t)M * K, GARBAGE); /* overwritten */
            float *pw = frandom((size_t)K * N, 1.0f), *pb = frandom(N, 1.0f);
            float *dw = fcopy(pw, (size_t)K * N), *db = fcopy(pb, N);
            be->ops->matmul_bwd(be->ctx, A(dinp), dw, wb ? db : NULL, A(s.R), A(s.inp), s.w, M, K, N, N, wt);
            check_overwritten(dinp, (size_t)M * K);
            float *gw = fdiff(dw, pw, (size_t)K * N);
            fd_check(wt ? "matmul(w_trans) dinp" : "matmul dinp", mm_loss, &s, s.inp, dinp,
                     (size_t)M * K, SIZE_MAX);
            fd_check(wt ? "matmul(w_trans) dw" : "matmul dw", mm_loss, &s, s.w, gw, (size_t)K * N,
                     SIZE_MAX);
            if (wb) {
                float *gb = fdiff(db, pb, N);
                fd_check("matmul dbias", mm_loss, &s, s.bias, gb, N, SIZE_MAX);
                bfree(gb);
            } else {
                CHECK(memcmp(db, pb, N * sizeof(float)) == 0);
            }
            /* dinp NULL: only dw is accumulated, a second time */
            float *dw2 = fcopy(dw, (size_t)K * N);
            be->ops->matmul_bwd(be->ctx, NULL, dw2, NULL, A(s.R), A(s.inp), s.w, M, K, N, N, wt);
            for (int i = 0; i < K * N; i++) CHECK_NEAR_REL(dw2[i] - dw[i], gw[i], 1e-5, 1.0);

            bfree(s.inp), bfree(s.w), bfree(s.bias), bfree(s.out), bfree(s.R);
            bfree(dinp), bfree(pw), bfree(pb), bfree(dw), bfree(db), bfree(gw), bfree(dw2);
        }
    /* a larger bias gradient: exercises the column-chunked reduction (N not a multiple of 16) */
    {
        const int M = 500, K = 4, N = 37; /* M*N above the backend's parallel threshold */
        float *dout = frandom((size_t)M * N, 1.0f), *inp = frandom((size_t)M * K, 1.0f);
        float *w = frandom((size_t)K * N, 1.0f), *dw = falloc((size_t)K * N);
        float *db = frandom(N, 1.0f), *pb = fcopy(db, N);
        be->ops->matmul_bwd(be->ctx, NULL, dw, db, A(dout), A(inp), w, M, K, N, N, 0);
        for (int j = 0; j < N; j++) {
            double s = pb[j];
            for (int i = 0; i < M; i++) s += dout[i * N + j];
            CHECK_NEAR_REL(db[j], s, 1e-5, 1.0);
        }
        bfree(dout), bfree(inp), bfree(w), bfree(dw), bfree(db), bfree(pb);
    }
}

/* ---- attention ---- */

typedef struct {
    dt_att_shape sh;    /* B, T, NH, NKV, hs */
    int W, HQ;          /* qkv's row width (NH+2NKV)*hs, out's NH*hs */
    float *out, *att, *qkv, *R;
} att_state;

static double att_loss(void *s_) {
    att_state *s = s_;
    be->ops->attention_fwd(be->ctx, A(s->out), A(s->att), A(s->qkv), &s->sh);
    return dot_d(s->out, s->R, (size_t)s->sh.B * s->sh.T * s->HQ);
}

/* out and att against a double-precision loop over (b, h, t) with the causal mask; query head h
 * reads key/value head h / (NH/NKV) */
static void att_reference_check(const att_state *s) {
    const int B = s->sh.B, T = s->sh.T, NH = s->sh.NH, NKV = s->sh.NKV, hs = s->sh.hs, W = s->W;
    const double scale = 1.0 / sqrt((double)hs);
    double *p = malloc((size_t)T * sizeof(double));
    CHECK(p != NULL);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const int g = h / (NH / NKV);
                const float *q = s->qkv + ((size_t)b * T + t) * W + h * hs;
                double mx = -INFINITY, sum = 0.0;
                for (int j = 0; j <= t; j++) {
                    const float *k = s->qkv + ((size_t)b * T + j) * W + NH * hs + g * hs;
                    double d = 0;
                    for (int c = 0; c < hs; c++) d += (double)q[c] * k[c];
                    p[j] = d * scale;
                    mx = fmax(mx, p[j]);
                }
                for (int j = 0; j <= t; j++) sum += (p[j] = exp(p[j] - mx));
                const float *arow = s->att + (((size_t)b * NH + h) * T + t) * T;
                double asum = 0.0;
                for (int j = 0; j < T; j++) {
                    if (j <= t) {
                        p[j] /= sum;
                        CHECK_NEAR_REL(arow[j], p[j], 1e-5, 1e-3);
                    } else {
                        CHECK(arow[j] == 0.0f); /* clean probability matrix */
                    }
                    asum += arow[j];
                }
                CHECK_NEAR_REL(asum, 1.0, 1e-5, 1.0);
                for (int c = 0; c < hs; c++) {
                    double o = 0;
                    for (int j = 0; j <= t; j++)
                        o += p[j] * s->qkv[((size_t)b * T + j) * W + (NH + NKV) * hs + g * hs + c];
                    CHECK_NEAR_REL(s->out[((size_t)b * T + t) * s->HQ + h * hs + c], o, 1e-5, 1.0);
                }
            }
    free(p);
}

static void att_state_init(att_state *s, int B, int T, int NH, int NKV, int hs, float amp) {
    *s = (att_state){.sh = {B, T, NH, NKV, hs}, .W = (NH + 2 * NKV) * hs, .HQ = NH * hs};
    s->qkv = frandom((size_t)B * T * s->W, amp);
    s->out = falloc((size_t)B * T * s->HQ);
    s->att = falloc((size_t)B * NH * T * T);
    ffill(s->out, (size_t)B * T * s->HQ, GARBAGE);
    ffill(s->att, (size_t)B * NH * T * T, GARBAGE);
    s->R = frandom((size_t)B * T * s->HQ, 1.0f);
}

static void att_state_free(att_state *s) {
    bfree(s->qkv), bfree(s->out), bfree(s->att), bfree(s->R);
}

/* causal mask: changing the k and v of position tf (every head, batch 0) leaves earlier
 * positions bit-identical, and changes position tf itself */
static void att_mask_check(att_state *s) {
    const int T = s->sh.T, NH = s->sh.NH, W = s->W, HQ = s->HQ, tf = T / 2;
    const size_t nqkv = (size_t)s->sh.B * T * W, nout = (size_t)s->sh.B * T * HQ, natt = (size_t)s->sh.B * NH * T * T;
    float *out0 = fcopy(s->out, nout), *att0 = fcopy(s->att, natt);
    float *qkv0 = fcopy(s->qkv, nqkv);
    for (int c = NH * s->sh.hs; c < W; c++) s->qkv[(size_t)tf * W + c] += 1.0f + frand();
    att_loss(s);
    for (int t = 0; t < T; t++) {
        const int same = memcmp(out0 + (size_t)t * HQ, s->out + (size_t)t * HQ, HQ * sizeof(float)) == 0;
        CHECK(t < tf ? same : 1);
        if (t == tf) CHECK(!same);
    }
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < tf; t++)
            CHECK(memcmp(att0 + ((size_t)h * T + t) * T, s->att + ((size_t)h * T + t) * T, T * sizeof(float)) == 0);
    memcpy(s->qkv, qkv0, nqkv * sizeof(float));
    bfree(out0), bfree(att0), bfree(qkv0);
    att_loss(s);
}

static void att_case(int B, int T, int NH, int NKV, int hs, size_t max_checks, float eps) {
    att_state s;
    att_state_init(&s, B, T, NH, NKV, hs, 2.0f);
    const size_t nqkv = (size_t)B * T * s.W;
    const size_t natt = (size_t)B * NH * T * T;
    att_loss(&s);
    att_reference_check(&s);
    if (T > 1) att_mask_check(&s);

    float *dqkv = falloc(nqkv), *datt = falloc(natt);
    ffill(dqkv, nqkv, GARBAGE); /* overwritten */
    ffill(datt, natt, GARBAGE); /* scratch */
    be->ops->attention_bwd(be->ctx, A(dqkv), A(datt), A(s.R), A(s.qkv), A(s.out), A(s.att), &s.sh);
    check_overwritten(dqkv, nqkv);
    fd_check_eps("attention dqkv", att_loss, &s, s.qkv, dqkv, nqkv, max_checks, eps);
    bfree(dqkv), bfree(datt);
    att_state_free(&s);
}

/* attention_cached fed the rows in pieces gives attention_fwd's rows, and the cache holds the
 * key/value heads of every row */
static void att_cached_case(int T, int NH, int NKV, int hs) {
    att_state s;
    att_state_init(&s, 1, T, NH, NKV, hs, 2.0f);
    att_loss(&s);
    const int KV = NKV * hs;
    float *kc = falloc((size_t)T * KV), *vc = falloc((size_t)T * KV), *out = falloc((size_t)T * s.HQ);
    float *scratch = falloc((size_t)T * NH * T);
    for (int pos = 0, n = 1; pos < T; pos += n, n = n % 3 + 1) {
        if (pos + n > T) n = T - pos;
        const dt_att_shape sh = {1, n, NH, NKV, hs, NULL};
        be->ops->attention_cached(be->ctx, A(out + (size_t)pos * s.HQ), A(kc), A(vc), scratch,
                                  A(s.qkv + (size_t)pos * s.W), pos, &sh);
    }
    for (int t = 0; t < T; t++) {
        CHECK(memcmp(kc + (size_t)t * KV, s.qkv + (size_t)t * s.W + NH * hs, KV * sizeof(float)) == 0);
        CHECK(memcmp(vc + (size_t)t * KV, s.qkv + (size_t)t * s.W + (NH + NKV) * hs, KV * sizeof(float)) == 0);
        for (int c = 0; c < s.HQ; c++) CHECK_NEAR_REL(out[(size_t)t * s.HQ + c], s.out[(size_t)t * s.HQ + c], 1e-5, 1.0);
    }
    bfree(kc), bfree(vc), bfree(out), bfree(scratch);
    att_state_free(&s);
}

/* Packed rows: examples side by side in one sequence of T rows (positions restarting at each
 * example's first row, dt_att_shape.pos). Each example's rows of out, P (its own columns; every
 * other column exactly 0) and dqkv equal those of the example run alone. The scratch starts as
 * NaN: what the ops read there but must not use (the softmax reads whole chunks of 16 columns,
 * masking the ones outside a row's example and past its diagonal) would show. T past 16 and 64:
 * examples that start inside a chunk, and blocks whose first key is not 0. */
static void att_packed_case(int T, const int *starts, int n_ex, int NH, int NKV, int hs) {
    att_state s;
    att_state_init(&s, 1, T, NH, NKV, hs, 2.0f);
    int *pos = ialloc((size_t)T);
    for (int e = 0; e < n_ex; e++)
        for (int t = starts[e]; t < (e + 1 < n_ex ? starts[e + 1] : T); t++) pos[t] = t - starts[e];
    s.sh.pos = pos;
    const size_t nqkv = (size_t)T * s.W, natt = (size_t)NH * T * T;
    ffill(s.att, natt, NAN);
    att_loss(&s);
    float *dqkv = falloc(nqkv), *datt = falloc(natt);
    ffill(dqkv, nqkv, GARBAGE);
    ffill(datt, natt, NAN);
    be->ops->attention_bwd(be->ctx, A(dqkv), A(datt), A(s.R), A(s.qkv), A(s.out), A(s.att), &s.sh);
    for (int e = 0; e < n_ex; e++) {
        const int t0 = starts[e], n = (e + 1 < n_ex ? starts[e + 1] : T) - t0;
        att_state one;
        att_state_init(&one, 1, n, NH, NKV, hs, 2.0f);
        memcpy(one.qkv, s.qkv + (size_t)t0 * s.W, (size_t)n * s.W * sizeof(float));
        memcpy(one.R, s.R + (size_t)t0 * s.HQ, (size_t)n * s.HQ * sizeof(float));
        att_loss(&one);
        float *dq1 = falloc((size_t)n * s.W), *da1 = falloc((size_t)NH * n * n);
        be->ops->attention_bwd(be->ctx, A(dq1), A(da1), A(one.R), A(one.qkv), A(one.out), A(one.att), &one.sh);
        for (int t = 0; t < n; t++) {
            for (int c = 0; c < s.HQ; c++)
                CHECK_NEAR_REL(s.out[(size_t)(t0 + t) * s.HQ + c], one.out[(size_t)t * s.HQ + c], 1e-5, 1.0);
            for (int c = 0; c < s.W; c++)
                CHECK_NEAR_REL(dqkv[(size_t)(t0 + t) * s.W + c], dq1[(size_t)t * s.W + c], 1e-5, 1.0);
            for (int h = 0; h < NH; h++) {
                const float *pr = s.att + ((size_t)h * T + t0 + t) * T, *p1 = one.att + ((size_t)h * n + t) * n;
                const float *dr = datt + ((size_t)h * T + t0 + t) * T;
                for (int j = 0; j < T; j++) {
                    const int mine = j >= t0 && j <= t0 + t;
                    if (mine) CHECK_NEAR_REL(pr[j], p1[j - t0], 1e-5, 1e-3);
                    else CHECK(pr[j] == 0.0f && dr[j] == 0.0f);
                }
            }
        }
        bfree(dq1), bfree(da1);
        att_state_free(&one);
    }
    bfree(dqkv), bfree(datt), bfree(pos);
    s.sh.pos = NULL;
    att_state_free(&s);
}

static void test_attention(void) {
    att_case(2, 5, 2, 2, 4, SIZE_MAX, FD_EPS);
    att_case(1, 1, 2, 2, 4, SIZE_MAX, FD_EPS);
    att_case(3, 4, 3, 3, 2, SIZE_MAX, FD_EPS); /* hs = 2 */
    /* grouped-query attention: key/value heads serve 2, 3, 4 query heads; a head size that is
     * not n_embd / n_head is the caller's business, here any */
    att_case(2, 6, 4, 2, 4, SIZE_MAX, FD_EPS);
    att_case(1, 7, 6, 2, 6, SIZE_MAX, FD_EPS);
    att_case(2, 5, 4, 1, 8, SIZE_MAX, FD_EPS); /* one key/value head for all (multi-query) */
    /* long sequences: one k or v element moves many outputs, so the float rounding of L
     * grows; a larger step keeps it below the floor (truncation stays ~1e-3 relative) */
    att_case(1, 80, 2, 2, 4, 400, 2e-2f);   /* crosses the 64-row block boundary */
    att_case(2, 130, 2, 2, 4, 300, 2e-2f);  /* three blocks, the last one partial */
    att_case(1, 70, 6, 3, 4, 300, 2e-2f);   /* GQA across a block boundary */
    att_packed_case(40, (const int[]){0, 13, 30}, 3, 2, 2, 4);       /* examples inside chunks of 16 */
    att_packed_case(100, (const int[]){0, 5, 37, 70}, 4, 4, 2, 8);    /* GQA, a block's keys from 37 or 70 */
    att_packed_case(48, (const int[]){0, 16, 33}, 3, 2, 1, 16);       /* an example on a chunk's edge */
    att_cached_case(9, 2, 2, 4);
    att_cached_case(11, 6, 2, 4);
}

static void test_attention_determinism(void) {
    const int B = 2, T = 80, NH = 4, NKV = 2, hs = 4;
    const dt_att_shape sh = {B, T, NH, NKV, hs, NULL};
    const size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * hs, nout = (size_t)B * T * NH * hs;
    const size_t natt = (size_t)B * NH * T * T;
    float *qkv = frandom(nqkv, 2.0f), *dout = frandom(nout, 1.0f);
    float *out[2], *att[2], *dqkv[2], *datt[2];
    for (int r = 0; r < 2; r++) {
        out[r] = falloc(nout), att[r] = falloc(natt);
        dqkv[r] = falloc(nqkv), datt[r] = falloc(natt);
        be->ops->attention_fwd(be->ctx, A(out[r]), A(att[r]), A(qkv), &sh);
        be->ops->attention_bwd(be->ctx, A(dqkv[r]), A(datt[r]), A(dout), A(qkv), A(out[r]), A(att[r]), &sh);
    }
    CHECK(memcmp(out[0], out[1], nout * sizeof(float)) == 0);
    CHECK(memcmp(att[0], att[1], natt * sizeof(float)) == 0);
    CHECK(memcmp(dqkv[0], dqkv[1], nqkv * sizeof(float)) == 0);
    for (int r = 0; r < 2; r++) bfree(out[r]), bfree(att[r]), bfree(dqkv[r]), bfree(datt[r]);
    bfree(qkv), bfree(dout);
}

/* ---- the Llama family's ops: RMSNorm, rotary positions, SwiGLU ---- */

typedef struct {
    int N, C;
    float eps;
    float *out, *rstd, *inp, *w, *R;
} rms_state;

static double rms_loss(void *s_) {
    rms_state *s = s_;
    be->ops->rmsnorm_fwd(be->ctx, A(s->out), s->rstd, A(s->inp), s->w, s->N, s->C, s->eps);
    return dot_d(s->out, s->R, (size_t)s->N * s->C);
}

static void test_rmsnorm(void) {
    rms_state s = {.N = 6, .C = 10, .eps = 1e-5f};
    const int N = s.N, C = s.C;
    const size_t n = (size_t)N * C;
    s.inp = frandom(n, 2.0f);
    for (int c = 0; c < C; c++) s.inp[c] += 5.0f; /* a row far from zero */
    s.w = frandom(C, 1.0f);
    s.out = falloc(n), s.rstd = falloc(N);
    s.R = frandom(n, 1.0f);
    rms_loss(&s);
    for (int i = 0; i < N; i++) {
        double v = 0;
        for (int c = 0; c < C; c++) v += (double)s.inp[i * C + c] * s.inp[i * C + c];
        const double r = 1.0 / sqrt(v / C + 1e-5);
        CHECK_NEAR_REL(s.rstd[i], r, 1e-6, 1e-6);
        for (int c = 0; c < C; c++) CHECK_NEAR_REL(s.out[i * C + c], s.w[c] * s.inp[i * C + c] * r, 1e-6, 1.0);
    }
    /* backward accumulates into both */
    float *pin = frandom(n, 1.0f), *pw = frandom(C, 1.0f);
    float *dinp = fcopy(pin, n), *dw = fcopy(pw, C);
    be->ops->rmsnorm_bwd(be->ctx, A(dinp), dw, A(s.R), A(s.inp), s.w, s.rstd, N, C);
    float *gin = fdiff(dinp, pin, n), *gw = fdiff(dw, pw, C);
    fd_check("rmsnorm dinp", rms_loss, &s, s.inp, gin, n, SIZE_MAX);
    fd_check("rmsnorm dw", rms_loss, &s, s.w, gw, C, SIZE_MAX);
    bfree(s.inp), bfree(s.w), bfree(s.out), bfree(s.rstd), bfree(s.R);
    bfree(pin), bfree(pw), bfree(dinp), bfree(dw), bfree(gin), bfree(gw);
}

typedef struct {
    dt_att_shape sh;
    int pos0;
    float *qkv, *x, *inv_freq, *R;
} rope_state;

static double rope_loss(void *s_) {
    rope_state *s = s_;
    const size_t n = (size_t)s->sh.B * s->sh.T * (s->sh.NH + 2 * s->sh.NKV) * s->sh.hs;
    memcpy(s->qkv, s->x, n * sizeof(float));
    be->ops->rope_fwd(be->ctx, A(s->qkv), s->inv_freq, s->pos0, &s->sh);
    return dot_d(s->qkv, s->R, n);
}

/* rope_fwd against Hugging Face's formula in double (q and k rotated, v untouched), rope_bwd
 * against finite differences, and the two are inverses */
static void rope_case(int B, int T, int NH, int NKV, int hs, int pos0) {
    rope_state s = {.sh = {B, T, NH, NKV, hs}, .pos0 = pos0};
    const int W = (NH + 2 * NKV) * hs, half = hs / 2;
    const size_t n = (size_t)B * T * W;
    s.x = frandom(n, 1.0f), s.qkv = falloc(n), s.R = frandom(n, 1.0f), s.inv_freq = falloc((size_t)half);
    for (int i = 0; i < half; i++) s.inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)hs);
    rope_loss(&s);
    for (int bt = 0; bt < B * T; bt++)
        for (int c = 0; c < W; c++) {
            const float *x = s.x + (size_t)bt * W;
            const int head = c / hs, i = c % hs, j = i % half;
            double want = x[c];
            if (head < NH + NKV) {
                const double a = (double)(float)((float)(pos0 + bt % T) * s.inv_freq[j]);
                want = i < half ? x[c] * cos(a) - x[c + half] * sin(a) : x[c] * cos(a) + x[c - half] * sin(a);
            }
            CHECK_NEAR_REL(s.qkv[(size_t)bt * W + c], want, 1e-5, 1.0);
        }
    float *d = fcopy(s.R, n);
    be->ops->rope_bwd(be->ctx, A(d), s.inv_freq, pos0, &s.sh);
    fd_check("rope dqkv", rope_loss, &s, s.x, d, n, 200);
    rope_loss(&s);
    be->ops->rope_bwd(be->ctx, A(s.qkv), s.inv_freq, pos0, &s.sh); /* undoes the forward */
    for (size_t i = 0; i < n; i++) CHECK_NEAR_REL(s.qkv[i], s.x[i], 1e-5, 1.0);
    bfree(d), bfree(s.x), bfree(s.qkv), bfree(s.R), bfree(s.inv_freq);
}

static void test_rope(void) {
    rope_case(2, 5, 2, 2, 8, 0);
    rope_case(1, 7, 6, 2, 4, 0);   /* GQA: 6 q heads and 2 k heads rotated, 2 v heads not */
    rope_case(1, 3, 3, 1, 16, 40); /* a continuation at position 40 (decoding) */
}

typedef struct {
    int N, F;
    float *out, *inp, *R;
} glu_state;

static double glu_loss(void *s_) {
    glu_state *s = s_;
    be->ops->swiglu_fwd(be->ctx, A(s->out), A(s->inp), s->N, s->F);
    return dot_d(s->out, s->R, (size_t)s->N * s->F);
}

static void test_swiglu(void) {
    glu_state s = {.N = 5, .F = 7};
    const size_t n = (size_t)s.N * s.F;
    s.inp = frandom(2 * n, 4.0f), s.out = falloc(n), s.R = frandom(n, 1.0f);
    s.inp[0] = -90.0f, s.inp[1] = 90.0f; /* far out on both sides */
    glu_loss(&s);
    for (int r = 0; r < s.N; r++)
        for (int i = 0; i < s.F; i++) {
            const double g = s.inp[(size_t)r * 2 * s.F + i], u = s.inp[(size_t)r * 2 * s.F + s.F + i];
            CHECK_NEAR_REL(s.out[(size_t)r * s.F + i], g / (1.0 + exp(-g)) * u, 1e-5, 1e-3);
        }
    float *d = falloc(2 * n);
    ffill(d, 2 * n, GARBAGE);
    be->ops->swiglu_bwd(be->ctx, A(d), A(s.inp), A(s.R), s.N, s.F);
    check_overwritten(d, 2 * n);
    s.inp[0] = -3.0f, s.inp[1] = 3.0f; /* finite differences where the curve is not flat */
    be->ops->swiglu_bwd(be->ctx, A(d), A(s.inp), A(s.R), s.N, s.F);
    fd_check("swiglu dinp", glu_loss, &s, s.inp, d, 2 * n, SIZE_MAX);
    bfree(d), bfree(s.inp), bfree(s.out), bfree(s.R);
}

/* ---- gelu, add ---- */

typedef struct {
    size_t n;
    float *out, *inp, *b, *R;
} ew_state;

static double gelu_loss(void *s_) {
    ew_state *s = s_;
    be->ops->gelu_fwd(be->ctx, A(s->out), A(s->inp), s->n);
    return dot_d(s->out, s->R, s->n);
}

static double add_loss(void *s_) {
    ew_state *s = s_;
    be->ops->add(be->ctx, A(s->out), A(s->inp), A(s->b), s->n);
    return dot_d(s->out, s->R, s->n);
}

static void test_gelu_add(void) {
    ew_state s = {.n = 64};
    s.inp = frandom(s.n, 4.0f);
    s.b = frandom(s.n, 1.0f);
    s.out = falloc(s.n);
    s.R = frandom(s.n, 1.0f);
    gelu_loss(&s);
    for (size_t i = 0; i < s.n; i++) {
        const double x = s.inp[i];
        const double ref = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
        /* 1 + tanh(u) cancels in float for x << 0: absolute floor 5e-7 */
        CHECK_NEAR_REL(s.out[i], ref, 1e-5, 5e-2);
    }
    float *dinp = falloc(s.n);
    ffill(dinp, s.n, GARBAGE);
    be->ops->gelu_bwd(be->ctx, A(dinp), A(s.inp), A(s.R), s.n);
    fd_check("gelu dinp", gelu_loss, &s, s.inp, dinp, s.n, SIZE_MAX);

    /* add: exact, also in place; dL/da = dL/db = R */
    add_loss(&s);
    for (size_t i = 0; i < s.n; i++) CHECK(s.out[i] == s.inp[i] + s.b[i]);
    fd_check("add da", add_loss, &s, s.inp, s.R, s.n, SIZE_MAX);
    fd_check("add db", add_loss, &s, s.b, s.R, s.n, SIZE_MAX);
    add_loss(&s); /* fd_check leaves out from a perturbed evaluation */
    float *a = fcopy(s.inp, s.n);
    be->ops->add(be->ctx, A(a), A(a), A(s.b), s.n);
    CHECK(memcmp(a, s.out, s.n * sizeof(float)) == 0);

    bfree(s.inp), bfree(s.b), bfree(s.out), bfree(s.R), bfree(dinp), bfree(a);
}

/* ---- cross-entropy ---- */

typedef struct {
    int N, V;
    float scale;
    float *losses, *probs, *logits;
    int *tg;
} xent_state;

static double xent_loss(void *s_) {
    xent_state *s = s_;
    be->ops->xent_fwd(be->ctx, s->losses, A(s->probs), A(s->logits), s->tg, s->N, s->V, s->V);
    double l = 0.0;
    for (int i = 0; i < s->N; i++) l += s->losses[i];
    return s->scale * l;
}

static void test_xent(void) {
    xent_state s = {.N = 6, .V = 7, .scale = 1.0f / 3.0f}; /* not a power of two: xent_fused rounds as the two calls do */
    const int N = s.N, V = s.V, targets[6] = {2, -1, 0, 6, -1, 3};
    const size_t n = (size_t)N * V;
    s.tg = ialloc(N);
    memcpy(s.tg, targets, sizeof targets);
    s.logits = frandom(n, 3.0f);
    for (int j = 0; j < V; j++) s.logits[3 * V + j] += 1000.0f; /* stability */
    s.probs = falloc(n);
    s.losses = falloc(N);
    xent_loss(&s);
    for (int i = 0; i < N; i++) {
        double mx = -INFINITY, sum = 0.0, psum = 0.0;
        for (int j = 0; j < V; j++) mx = fmax(mx, s.logits[i * V + j]);
        for (int j = 0; j < V; j++) sum += exp(s.logits[i * V + j] - mx);
        for (int j = 0; j < V; j++) {
            CHECK_NEAR_REL(s.probs[i * V + j], exp(s.logits[i * V + j] - mx) / sum, 1e-5, 1e-6);
            psum += s.probs[i * V + j];
        }
        CHECK_NEAR_REL(psum, 1.0, 1e-5, 1.0);
        if (targets[i] < 0) CHECK(s.losses[i] == 0.0f);
        else
            CHECK_NEAR_REL(s.losses[i], log(sum) - (s.logits[i * V + targets[i]] - mx), 1e-5,
                           1e-3);
    }

    float *dl = falloc(n);
    ffill(dl, n, GARBAGE);
    be->ops->xent_bwd(be->ctx, A(dl), A(s.probs), s.tg, s.scale, N, V, V);
    for (int j = 0; j < V; j++) CHECK(dl[1 * V + j] == 0.0f && dl[4 * V + j] == 0.0f);
    fd_check("xent dlogits", xent_loss, &s, s.logits, dl, n, SIZE_MAX);

    /* probs aliasing logits, dlogits aliasing probs: bit-identical to the separate buffers */
    xent_loss(&s);
    float *buf = fcopy(s.logits, n), *losses2 = falloc(N);
    be->ops->xent_fwd(be->ctx, losses2, A(buf), A(buf), s.tg, N, V, V);
    CHECK(memcmp(buf, s.probs, n * sizeof(float)) == 0);
    CHECK(memcmp(losses2, s.losses, N * sizeof(float)) == 0);
    be->ops->xent_bwd(be->ctx, A(buf), A(buf), s.tg, s.scale, N, V, V);
    CHECK(memcmp(buf, dl, n * sizeof(float)) == 0);

    /* xent_fused: the two calls' losses and gradient bit for bit, in place too */
    CHECK(be->ops->xent_fused != NULL);
    float *fused = fcopy(s.logits, n), *losses3 = falloc(N), *dl3 = falloc(n);
    ffill(dl3, n, GARBAGE);
    be->ops->xent_fused(be->ctx, losses3, A(dl3), A(s.logits), s.tg, s.scale, N, V, V);
    CHECK(memcmp(losses3, s.losses, N * sizeof(float)) == 0);
    CHECK(memcmp(dl3, dl, n * sizeof(float)) == 0);
    ffill(losses3, N, GARBAGE);
    be->ops->xent_fused(be->ctx, losses3, A(fused), A(fused), s.tg, s.scale, N, V, V);
    CHECK(memcmp(losses3, s.losses, N * sizeof(float)) == 0);
    CHECK(memcmp(fused, dl, n * sizeof(float)) == 0);

    bfree(s.tg), bfree(s.logits), bfree(s.probs), bfree(s.losses), bfree(dl), bfree(buf);
    bfree(losses2), bfree(fused), bfree(losses3), bfree(dl3);
}

/* Tensor parallelism over the vocabulary: the embedding and the cross-entropy in shares of
 * uneven widths (7 rows in 3 shares: 2, 2, 3) give what the whole ops give: the shares' embedding
 * rows sum to encoder_fwd's (positions added by one share), their gradients are encoder_bwd's rows;
 * the shares' stats combine into xent_fwd's losses, their gradients are xent_bwd's columns. */
static void test_vocab_shares(void) {
    enum { B = 2, T = 3, C = 4, V = 7, N = 6, S = 3 };
    const int tokens[B * T] = {1, 6, 1, 3, 0, 6}, targets[N] = {2, -1, 0, 6, -1, 3}, lo[S + 1] = {0, 2, 4, 7};
    int *tok = ialloc(B * T), *tg = ialloc(N);
    memcpy(tok, tokens, sizeof tokens);
    memcpy(tg, targets, sizeof targets);
    float *wte = frandom((size_t)V * C, 1.0f), *wpe = frandom((size_t)T * C, 1.0f);
    float *whole = falloc((size_t)B * T * C), *part = falloc((size_t)B * T * C), *sum = falloc((size_t)B * T * C);
    be->ops->encoder_fwd(be->ctx, A(whole), tok, NULL, wte, wpe, B, T, C);
    ffill(sum, (size_t)B * T * C, 0.0f);
    float *R = frandom((size_t)B * T * C, 1.0f), *dwte = falloc((size_t)V * C), *dpart = falloc((size_t)V * C);
    ffill(dwte, (size_t)V * C, 0.0f);
    ffill(dpart, (size_t)V * C, 0.0f);
    be->ops->encoder_bwd(be->ctx, dwte, NULL, A(R), tok, NULL, B, T, C);
    for (int s = 0; s < S; s++) {
        ffill(part, (size_t)B * T * C, GARBAGE);
        be->ops->encoder_part_fwd(be->ctx, A(part), tok, NULL, wte + (size_t)lo[s] * C, s == 0 ? wpe : NULL, lo[s],
                                  lo[s + 1] - lo[s], B, T, C);
        for (size_t i = 0; i < (size_t)B * T * C; i++) sum[i] += part[i];
        be->ops->encoder_part_bwd(be->ctx, dpart + (size_t)lo[s] * C, NULL, A(R), tok, NULL, lo[s], lo[s + 1] - lo[s],
                                  B, T, C);
    }
    for (size_t i = 0; i < (size_t)B * T * C; i++) CHECK_NEAR_REL(sum[i], whole[i], 1e-6, 1e-6);
    CHECK(memcmp(dpart, dwte, (size_t)V * C * sizeof(float)) == 0);

    float *logits = frandom((size_t)N * V, 3.0f), *probs = falloc((size_t)N * V), *losses = falloc(N);
    for (int j = 0; j < V; j++) logits[3 * V + j] += 1000.0f; /* stability */
    be->ops->xent_fwd(be->ctx, losses, A(probs), A(logits), tg, N, V, V);
    float *dl = falloc((size_t)N * V), *stats = falloc((size_t)S * N * 4), *lse = falloc(N);
    be->ops->xent_bwd(be->ctx, A(dl), A(probs), tg, 0.5f, N, V, V);
    for (int s = 0; s < S; s++) /* each share's columns: rows V apart in the whole logits */
        be->ops->xent_part_stats(be->ctx, stats + (size_t)s * N * 4, A(logits + lo[s]), tg, lo[s], N,
                                 lo[s + 1] - lo[s], V);
    for (int i = 0; i < N; i++) {
        double M = -INFINITY, Ssum = 0, X = 0;
        int at = -1;
        for (int s = 0; s < S; s++)
            if (stats[(size_t)s * N * 4 + i * 4] > M) {
                M = stats[(size_t)s * N * 4 + i * 4];
                at = (int)stats[(size_t)s * N * 4 + i * 4 + 3];
            }
        for (int s = 0; s < S; s++) {
            Ssum += stats[(size_t)s * N * 4 + i * 4 + 1] * exp(stats[(size_t)s * N * 4 + i * 4] - M);
            X += stats[(size_t)s * N * 4 + i * 4 + 2];
        }
        lse[i] = (float)(M + log(Ssum));
        if (targets[i] >= 0) CHECK_NEAR_REL(M + log(Ssum) - X, losses[i], 1e-5, 1e-5);
        int best = 0;
        for (int j = 1; j < V; j++) best = logits[i * V + j] > logits[i * V + best] ? j : best;
        CHECK_INT_EQ(at, best);
    }
    float *dpl = fcopy(logits, (size_t)N * V);
    for (int s = 0; s < S; s++) /* in place */
        be->ops->xent_part_bwd(be->ctx, A(dpl + lo[s]), A(dpl + lo[s]), lse, tg, lo[s], 0.5f, N, lo[s + 1] - lo[s], V);
    /* row 3's logits are near 1000, where the float lse passed between the shares is only good to
     * its ulp, 6e-5: a relative error of up to 3e-5 in each probability */
    for (size_t i = 0; i < (size_t)N * V; i++) CHECK_NEAR_REL(dpl[i], dl[i], i / V == 3 ? 1e-4 : 1e-5, 1e-6);

    bfree(tok), bfree(tg), bfree(wte), bfree(wpe), bfree(whole), bfree(part), bfree(sum), bfree(R), bfree(dwte);
    bfree(dpart), bfree(logits), bfree(probs), bfree(losses), bfree(dl), bfree(stats), bfree(lse), bfree(dpl);
}

/* ---- gather / scatter ---- */

typedef struct {
    int n, C;
    float *out, *x, *R;
    int *rows;
} gs_state;

static double gather_loss(void *s_) {
    gs_state *s = s_;
    be->ops->gather_rows(be->ctx, A(s->out), A(s->x), s->rows, s->n, s->C);
    return dot_d(s->out, s->R, (size_t)s->n * s->C);
}

static void test_gather_scatter(void) {
    const int X = 5, rows[4] = {3, 1, 3, 0}; /* row 3 twice, rows 2 and 4 never */
    gs_state s = {.n = 4, .C = 40};          /* C spans two column chunks */
    const size_t nx = (size_t)X * s.C, nout = (size_t)s.n * s.C;
    s.rows = ialloc(s.n);
    memcpy(s.rows, rows, sizeof rows);
    s.x = frandom(nx, 1.0f);
    s.out = falloc(nout);
    s.R = frandom(nout, 1.0f);
    gather_loss(&s);
    for (int i = 0; i < s.n; i++)
        CHECK(memcmp(s.out + (size_t)i * s.C, s.x + (size_t)rows[i] * s.C,
                     s.C * sizeof(float)) == 0);
    float *pre = frandom(nx, 1.0f), *dx = fcopy(pre, nx);
    be->ops->scatter_add_rows(be->ctx, A(dx), A(s.R), s.rows, s.n, s.C);
    float *g = fdiff(dx, pre, nx);
    fd_check("scatter_add_rows", gather_loss, &s, s.x, g, nx, SIZE_MAX);
    for (int c = 0; c < s.C; c++) /* repeated row: both contributions, in order */
        CHECK(dx[3 * s.C + c] == (pre[3 * s.C + c] + s.R[c]) + s.R[2 * s.C + c]);
    bfree(s.rows), bfree(s.x), bfree(s.out), bfree(s.R), bfree(pre), bfree(dx), bfree(g);
}

/* argmax: the first maximum of each row; the check op reports nothing on CPU */
static void test_argmax_check(void) {
    const int N = 4, V = 7;
    float x[4 * 7] = {0};
    int *idx = ialloc(N);
    for (int k = 0; k < V; k++) {
        x[k] = (float)k;                  /* row 0: increasing -> 6 */
        x[V + k] = (float)(V - k);        /* row 1: decreasing -> 0 */
        x[2 * V + k] = k == 2 || k == 5;  /* row 2: tie -> the first, 2 */
        x[3 * V + k] = -1.0f - (k != 4);  /* row 3: negative values -> 4 */
    }
    be->ops->argmax(be->ctx, idx, A(x), N, V, V);
    CHECK_INT_EQ(idx[0], 6);
    CHECK_INT_EQ(idx[1], 0);
    CHECK_INT_EQ(idx[2], 2);
    CHECK_INT_EQ(idx[3], 4);
    CHECK_INT_EQ(be->ops->check(be->ctx), DT_OK);
    bfree(idx);
}

/* The logits' row stride (ops.h logits_stride, ld > V): matmul_fwd/bwd, xent_fwd/bwd and
 * argmax on rows ld apart give exactly what they give on dense rows, and never touch the
 * columns past V. (Products this small run on OpenBLAS; oneDNN, which runs products of 256 rows
 * or more, picks its kernel by the strides too, so there the two would differ by rounding.) */
static void test_strided_logits(void) {
    enum { M = 5, K = 6, V = 7, LD = 12 };
    float inp[M * K], w[V * K], dense[M * V], strided[M * LD], dinp_d[M * K], dinp_s[M * K];
    float dw_d[V * K] = {0}, dw_s[V * K] = {0}, loss_d[M], loss_s[M];
    int tg[M] = {3, -1, 0, 6, 2}, idx_d[M], idx_s[M];
    for (int i = 0; i < M * K; i++) inp[i] = (float)((i * 37) % 11) / 5.0f - 1.0f;
    for (int i = 0; i < V * K; i++) w[i] = (float)((i * 53) % 13) / 6.0f - 1.0f;
    for (int i = 0; i < M * LD; i++) strided[i] = GARBAGE;
    be->ops->matmul_fwd(be->ctx, A(dense), A(inp), w, NULL, M, K, V, V, 1);
    be->ops->matmul_fwd(be->ctx, A(strided), A(inp), w, NULL, M, K, V, LD, 1);
    be->ops->argmax(be->ctx, idx_d, A(dense), M, V, V);
    be->ops->argmax(be->ctx, idx_s, A(strided), M, V, LD);
    be->ops->xent_fwd(be->ctx, loss_d, A(dense), A(dense), tg, M, V, V);
    be->ops->xent_fwd(be->ctx, loss_s, A(strided), A(strided), tg, M, V, LD);
    be->ops->xent_bwd(be->ctx, A(dense), A(dense), tg, 0.5f, M, V, V);
    be->ops->xent_bwd(be->ctx, A(strided), A(strided), tg, 0.5f, M, V, LD);
    be->ops->matmul_bwd(be->ctx, A(dinp_d), dw_d, NULL, A(dense), A(inp), w, M, K, V, V, 1);
    be->ops->matmul_bwd(be->ctx, A(dinp_s), dw_s, NULL, A(strided), A(inp), w, M, K, V, LD, 1);
    for (int i = 0; i < M; i++) {
        CHECK_INT_EQ(idx_s[i], idx_d[i]);
        CHECK(loss_s[i] == loss_d[i]);
        for (int j = 0; j < LD; j++)
            CHECK(strided[i * LD + j] == (j < V ? dense[i * V + j] : GARBAGE));
    }
    CHECK(memcmp(dinp_s, dinp_d, sizeof dinp_d) == 0);
    CHECK(memcmp(dw_s, dw_d, sizeof dw_d) == 0);
}

/* ---- optimizer helpers ---- */

static void test_adamw(void) {
    const size_t n = 7;
    const float lr = 0.1f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 0.1f;
    float *p = frandom(n, 1.0f), *g = falloc(n), *m = falloc(n), *v = falloc(n);
    double rp[7], rm[7] = {0}, rv[7] = {0};
    for (size_t i = 0; i < n; i++) rp[i] = p[i];
    for (int t = 1; t <= 3; t++) {
        for (size_t i = 0; i < n; i++) g[i] = frand() * (i == 0 ? 1e-3f : 1.0f);
        const dt_adamw_piece all = {0, 0, n, 1};
        be->ops->adamw(be->ctx, p, g, m, v, &all, 1, lr, b1, b2, eps, wd, t);
        for (size_t i = 0; i < n; i++) {
            rp[i] -= (double)lr * wd * rp[i];
            rm[i] = (double)b1 * rm[i] + (1.0 - b1) * g[i];
            rv[i] = (double)b2 * rv[i] + (1.0 - b2) * (double)g[i] * g[i];
            const double mhat = rm[i] / (1.0 - pow(b1, t)), vhat = rv[i] / (1.0 - pow(b2, t));
            rp[i] -= lr * mhat / (sqrt(vhat) + eps);
            CHECK_NEAR_REL(m[i], rm[i], 1e-5, 1e-6);
            CHECK_NEAR_REL(v[i], rv[i], 1e-5, 1e-9);
            CHECK_NEAR_REL(p[i], rp[i], 1e-5, 1e-2); /* p0 ~ 1 and the steps of 0.1 may cancel: fp32's error at 1 */
        }
    }
    /* weight decay only: zero gradient, fresh state -> p *= 1 - lr*wd */
    float *q = frandom(n, 1.0f), *q0 = fcopy(q, n);
    float *z = falloc(n), *zm = falloc(n), *zv = falloc(n);
    const dt_adamw_piece all = {0, 0, n, 1};
    be->ops->adamw(be->ctx, q, z, zm, zv, &all, 1, lr, b1, b2, eps, wd, 1);
    for (size_t i = 0; i < n; i++)
        CHECK_NEAR_REL(q[i], q0[i] * (1.0 - (double)lr * wd), 1e-6, 1e-6);
    bfree(p), bfree(g), bfree(m), bfree(v), bfree(q), bfree(q0), bfree(z), bfree(zm), bfree(zv);
}

static void test_sumsq_scale(void) {
    const size_t sizes[4] = {0, 1, 63, 100003};
    for (int k = 0; k < 4; k++) {
        const size_t n = sizes[k];
        float *x = frandom(n ? n : 1, 3.0f);
        double ref = 0.0;
        for (size_t i = 0; i < n; i++) ref += (double)x[i] * x[i];
        const dt_range all = {0, n}, two[2] = {{0, n / 2}, {n / 2, n - n / 2}};
        double s1, s2, s3;
        be->ops->sumsq(be->ctx, &s1, x, &all, 1);
        be->ops->sumsq(be->ctx, &s2, x, &all, 1);
        CHECK_NEAR_REL(s1, ref, 1e-12, 1e-30);
        CHECK(memcmp(&s1, &s2, sizeof s1) == 0);
        /* two ranges: each range's sum as one call gives it, added in order */
        double h1, h2;
        be->ops->sumsq(be->ctx, &h1, x, &two[0], 1);
        be->ops->sumsq(be->ctx, &h2, x, &two[1], 1);
        be->ops->sumsq(be->ctx, &s3, x, two, 2);
        CHECK(s3 == 0.0 + h1 + h2);
        float *y = fcopy(x, n ? n : 1);
        be->ops->scale(be->ctx, y, &all, 1, -0.37f);
        for (size_t i = 0; i < n; i++) CHECK(y[i] == x[i] * -0.37f);
        be->ops->scale(be->ctx, y, two, 2, 2.0f);
        for (size_t i = 0; i < n; i++) CHECK(y[i] == x[i] * -0.37f * 2.0f);
        bfree(x), bfree(y);
    }
}

/* The optimizer's loops give the bits of their scalar definitions, whatever the vector width
 * (this tests the clone this CPU runs: AVX-512, AVX2 or baseline): AdamW element by element in
 * float, in ops_cpu.c's order of operations (no contraction into FMAs: ops_cpu.c is built with
 * contraction off, this file for baseline x86-64, which has none); the sum of squares as 64
 * fixed chunks of ceil(n/64), each summed in order in double, the chunks added in order. Pieces
 * at odd offsets and lengths leave vector tails on both sides. */
static void test_optimizer_bits(void) {
    const size_t n = 40037;
    const float lr = 3e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    float *p = frandom(n, 1.0f), *g = frandom(n, 1.0f), *m = frandom(n, 0.1f), *v = falloc(n);
    for (size_t i = 0; i < n; i++) v[i] = 0.01f * (1.0f + frand());
    float *rp = fcopy(p, n), *rm = fcopy(m, n), *rv = fcopy(v, n), *p0 = fcopy(p, n), *m0 = fcopy(m, n),
          *v0 = fcopy(v, n);
    const dt_adamw_piece pieces[3] = {{3, 3, 20001, 1}, {20004, 20004, 33, 0}, {20037, 20037, 20000, 1}};
    for (int t = 1; t <= 2; t++) {
        const double bc1 = 1.0 - pow((double)b1, t), bc2 = 1.0 - pow((double)b2, t);
        const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
        for (int k = 0; k < 3; k++) {
            const float decay = 1.0f - lr * (pieces[k].decay ? wd : 0.0f);
            for (size_t i = pieces[k].offset; i < pieces[k].offset + pieces[k].numel; i++) {
                const float gi = g[i];
                const float mi = b1 * rm[i] + (1.0f - b1) * gi;
                const float vi = b2 * rv[i] + (1.0f - b2) * gi * gi;
                rm[i] = mi, rv[i] = vi;
                rp[i] = rp[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
            }
        }
    }
    /* one region over all pieces, cut into a stretch a thread wherever the cuts fall (end to end,
     * inside the 33-float piece at 2 threads, the first and the third at 3): every element updated
     * once, as alone */
    const int threads = be->ops->set_threads && !getenv("OMP_NUM_THREADS") ? 3 : 1; /* valgrind: one */
    for (int th = 1; th <= threads; th++) {
        if (threads > 1) be->ops->set_threads(be->ctx, th);
        memcpy(p, p0, n * sizeof(float)), memcpy(m, m0, n * sizeof(float)), memcpy(v, v0, n * sizeof(float));
        for (int t = 1; t <= 2; t++) be->ops->adamw(be->ctx, p, g, m, v, pieces, 3, lr, b1, b2, eps, wd, t);
        CHECK(memcmp(p, rp, n * sizeof(float)) == 0);
        CHECK(memcmp(m, rm, n * sizeof(float)) == 0);
        CHECK(memcmp(v, rv, n * sizeof(float)) == 0);
        /* zero: a buffer cleared by every thread, a stretch each, odd sizes cut at 64 bytes */
        const size_t zb[3] = {5, 65536 + 4, n * sizeof(float) - 12};
        for (int k = 0; k < 3; k++) {
            unsigned char *z = (unsigned char *)fcopy(g, n);
            be->ops->zero(be->ctx, z + 4, zb[k]);
            size_t bad = 0;
            for (size_t i = 0; i < n * sizeof(float); i++) bad += z[i] != (i >= 4 && i < 4 + zb[k] ? 0 : ((unsigned char *)g)[i]);
            CHECK(bad == 0);
            bfree(z);
        }
    }
    if (threads > 1) be->ops->set_threads(be->ctx, 2);
    bfree(p0), bfree(m0), bfree(v0);
    /* the sum of squares: all chunks, then each chunk alone (the others zero), as one chunk's
     * order decides bits that adding the other chunks' sums would round away */
    const size_t sizes[5] = {1, 63, 1000, 100003, 1 << 20};
    for (int k = 0; k < 5; k++) {
        const size_t len = sizes[k], chunk = (len + 63) / 64;
        float *x = frandom(len, 3.0f);
        for (size_t i = 0; i < len; i++) x[i] = ldexpf(x[i], irand(40) - 20); /* most adds round */
        for (int only = -1; only < (len < 200000 ? 64 : 0); only++) {
            float *y = fcopy(x, len);
            if (only >= 0)
                for (size_t i = 0; i < len; i++)
                    if (i / chunk != (size_t)only) y[i] = 0.0f;
            double ref = 0.0;
            for (size_t c = 0; c < 64; c++) {
                double part = 0.0;
                for (size_t i = c * chunk; i < (c + 1) * chunk && i < len; i++) part += (double)y[i] * y[i];
                ref += part;
            }
            double got = -1.0;
            const dt_range all = {0, len};
            be->ops->sumsq(be->ctx, &got, y, &all, 1);
            CHECK(memcmp(&got, &ref, sizeof got) == 0);
            bfree(y);
        }
        bfree(x);
    }
    bfree(p), bfree(g), bfree(m), bfree(v), bfree(rp), bfree(rm), bfree(rv);
}

/* the training loss's sum: rows with a target (>= 0), in order, from 0, then added to *acc */
static void test_loss_sum(void) {
    const int n = 1001;
    float *l = frandom((size_t)n, 3.0f);
    int *t = malloc((size_t)n * sizeof *t);
    CHECK(t != NULL);
    double sum = 0.0, all = 0.0;
    for (int i = 0; i < n; i++) {
        t[i] = i % 4 == 1 ? -1 : i % 7;
        if (t[i] >= 0) sum += l[i];
        all += l[i];
    }
    double *acc;
    CHECK(be->ops->alloc(be->ctx, sizeof *acc, "test", (void **)&acc) == DT_OK);
    *acc = 2.5;
    be->ops->loss_sum(be->ctx, acc, l, t, n);
    CHECK(*acc == 2.5 + sum);
    be->ops->loss_sum(be->ctx, acc, l, NULL, n);
    CHECK(*acc == 2.5 + sum + all);
    bfree(acc), bfree(l);
    free(t);
}

/* ---- the same be at sizes above the backend's parallel threshold (16384 elements),
 * against double references; the small cases above may run on one thread ---- */

static double gelu_d(double x) {
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double gelu_grad_d(double x) {
    const double k = sqrt(2.0 / M_PI), t = tanh(k * (x + 0.044715 * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

static void test_large_sizes(void) {
    /* layernorm forward and backward (backward reference: the analytic formula in double) */
    {
        const int N = 64, C = 300;
        const size_t n = (size_t)N * C;
        float *inp = frandom(n, 3.0f), *w = frandom(C, 1.0f), *b = frandom(C, 1.0f);
        float *out = falloc(n), *mean = falloc(N), *rstd = falloc(N), *dout = frandom(n, 1.0f);
        float *dinp = frandom(n, 1.0f), *dw = frandom(C, 1.0f), *db = frandom(C, 1.0f);
        float *pin = fcopy(dinp, n), *pw = fcopy(dw, C), *pb = fcopy(db, C);
        double *rw = calloc(C, sizeof(double)), *rb = calloc(C, sizeof(double));
        CHECK(rw && rb);
        be->ops->layernorm_fwd(be->ctx, A(out), mean, rstd, A(inp), w, b, N, C);
        be->ops->layernorm_bwd(be->ctx, A(dinp), dw, db, A(dout), A(inp), w, mean, rstd, N, C);
        for (int i = 0; i < N; i++) {
            const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
            double m = 0, v = 0, a = 0, a2 = 0;
            for (int c = 0; c < C; c++) m += x[c];
            m /= C;
            for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
            const double r = 1.0 / sqrt(v / C + 1e-5);
            CHECK_NEAR_REL(mean[i], m, 1e-5, 1e-3);
            CHECK_NEAR_REL(rstd[i], r, 1e-5, 1e-3);
            for (int c = 0; c < C; c++) {
                const double nc = (x[c] - m) * r;
                CHECK_NEAR_REL(out[(size_t)i * C + c], nc * w[c] + b[c], 1e-5, 1.0);
                a += (double)w[c] * dy[c];
                a2 += (double)w[c] * dy[c] * nc;
                rw[c] += dy[c] * nc;
                rb[c] += dy[c];
            }
            a /= C, a2 /= C;
            for (int c = 0; c < C; c++) {
                const double nc = (x[c] - m) * r;
                const double g = r * ((double)w[c] * dy[c] - a - nc * a2);
                CHECK_NEAR_REL(dinp[(size_t)i * C + c] - pin[(size_t)i * C + c], g, 1e-4, 1.0);
            }
        }
        for (int c = 0; c < C; c++) {
            CHECK_NEAR_REL(dw[c] - pw[c], rw[c], 1e-4, 1.0);
            CHECK_NEAR_REL(db[c] - pb[c], rb[c], 1e-4, 1.0);
        }
        free(rw), free(rb);
        bfree(inp), bfree(w), bfree(b), bfree(out), bfree(mean), bfree(rstd), bfree(dout);
        bfree(dinp), bfree(dw), bfree(db), bfree(pin), bfree(pw), bfree(pb);
    }
    /* gelu, add, scale */
    {
        const size_t n = 20000;
        float *x = frandom(n, 5.0f), *y = falloc(n), *dy = frandom(n, 1.0f), *dx = falloc(n);
        be->ops->gelu_fwd(be->ctx, A(y), A(x), n);
        be->ops->gelu_bwd(be->ctx, A(dx), A(x), A(dy), n);
        for (size_t i = 0; i < n; i++) {
            CHECK_NEAR_REL(y[i], gelu_d(x[i]), 1e-5, 5e-2);
            CHECK_NEAR_REL(dx[i], gelu_grad_d(x[i]) * dy[i], 1e-5, 5e-2);
        }
        be->ops->add(be->ctx, A(y), A(x), A(dy), n);
        for (size_t i = 0; i < n; i++) CHECK(y[i] == x[i] + dy[i]);
        bfree(x), bfree(y), bfree(dy), bfree(dx);
    }
    /* column reductions wide enough for 64-column tasks (ops_cpu.c col_width), with a tail: a
     * bias gradient over strided rows and RMSNorm's weight gradient, against sums in double */
    {
        const int M = 70, N = 300, ld = 305;
        float *dout = frandom((size_t)M * ld, 1.0f), *db = frandom(N, 1.0f), *db0 = fcopy(db, N);
        be->ops->matmul_bwd(be->ctx, NULL, NULL, db, A(dout), NULL, NULL, M, 0, N, ld, 0);
        for (int j = 0; j < N; j++) {
            double r = db0[j];
            for (int i = 0; i < M; i++) r += dout[(size_t)i * ld + j];
            CHECK_NEAR_REL(db[j], r, 1e-5, 1.0);
        }
        float *x = frandom((size_t)M * N, 2.0f), *dy = frandom((size_t)M * N, 1.0f), *w = frandom(N, 1.0f);
        float *rstd = falloc(M), *y = falloc((size_t)M * N), *dx = falloc((size_t)M * N);
        float *dw = frandom(N, 1.0f), *dw0 = fcopy(dw, N);
        be->ops->rmsnorm_fwd(be->ctx, A(y), rstd, A(x), w, M, N, 1e-5f);
        be->ops->rmsnorm_bwd(be->ctx, A(dx), dw, A(dy), A(x), w, rstd, M, N);
        for (int j = 0; j < N; j++) {
            double r = dw0[j];
            for (int i = 0; i < M; i++) r += (double)dy[(size_t)i * N + j] * x[(size_t)i * N + j] * rstd[i];
            CHECK_NEAR_REL(dw[j], r, 1e-5, 1.0);
        }
        bfree(dout), bfree(db), bfree(db0), bfree(x), bfree(dy), bfree(w), bfree(rstd), bfree(y), bfree(dx),
            bfree(dw), bfree(dw0);
    }
    /* cross-entropy */
    {
        const int N = 40, V = 500;
        const size_t n = (size_t)N * V;
        int *tg = ialloc(N);
        for (int i = 0; i < N; i++) tg[i] = i % 5 == 0 ? -1 : irand(V);
        float *logits = frandom(n, 4.0f), *probs = falloc(n), *losses = falloc(N), *dl = falloc(n);
        be->ops->xent_fwd(be->ctx, losses, A(probs), A(logits), tg, N, V, V);
        be->ops->xent_bwd(be->ctx, A(dl), A(probs), tg, 0.25f, N, V, V);
        for (int i = 0; i < N; i++) {
            double mx = -INFINITY, sum = 0.0;
            for (int j = 0; j < V; j++) mx = fmax(mx, logits[(size_t)i * V + j]);
            for (int j = 0; j < V; j++) sum += exp(logits[(size_t)i * V + j] - mx);
            for (int j = 0; j < V; j++) {
                const double p = exp(logits[(size_t)i * V + j] - mx) / sum;
                CHECK_NEAR_REL(probs[(size_t)i * V + j], p, 1e-5, 1e-6);
                const double d = tg[i] < 0 ? 0.0 : 0.25 * (p - (j == tg[i]));
                CHECK_NEAR_REL(dl[(size_t)i * V + j], d, 1e-5, 1e-6);
            }
            if (tg[i] < 0) CHECK(losses[i] == 0.0f);
            else
                CHECK_NEAR_REL(losses[i], log(sum) - (logits[(size_t)i * V + tg[i]] - mx), 1e-5,
                               1e-3);
        }
        bfree(tg), bfree(logits), bfree(probs), bfree(losses), bfree(dl);
    }
    /* gather / scatter with repeated rows: exact against the serial loop */
    {
        const int X = 6, n = 9, C = 2100;
        int *rows = ialloc(n);
        for (int i = 0; i < n; i++) rows[i] = irand(3); /* rows 0..2 only: many repeats */
        float *x = frandom((size_t)X * C, 1.0f), *out = falloc((size_t)n * C);
        float *dx = frandom((size_t)X * C, 1.0f), *ref = fcopy(dx, (size_t)X * C);
        be->ops->gather_rows(be->ctx, A(out), A(x), rows, n, C);
        be->ops->scatter_add_rows(be->ctx, A(dx), A(out), rows, n, C);
        for (int i = 0; i < n; i++)
            for (int c = 0; c < C; c++) {
                CHECK(out[(size_t)i * C + c] == x[(size_t)rows[i] * C + c]);
                ref[(size_t)rows[i] * C + c] += out[(size_t)i * C + c];
            }
        CHECK(memcmp(dx, ref, (size_t)X * C * sizeof(float)) == 0);
        bfree(rows), bfree(x), bfree(out), bfree(dx), bfree(ref);
    }
    /* AdamW, one step from a warm state */
    {
        const size_t n = 20000;
        const float lr = 3e-3f, b1 = 0.8f, b2 = 0.95f, eps = 1e-6f, wd = 0.5f;
        const int t = 5;
        float *p = frandom(n, 1.0f), *g = frandom(n, 1.0f), *m = frandom(n, 0.1f), *v = falloc(n);
        for (size_t i = 0; i < n; i++) v[i] = 0.01f * (1.0f + frand());
        float *p0 = fcopy(p, n), *m0 = fcopy(m, n), *v0 = fcopy(v, n);
        const dt_adamw_piece all = {0, 0, n, 1};
        be->ops->adamw(be->ctx, p, g, m, v, &all, 1, lr, b1, b2, eps, wd, t);
        for (size_t i = 0; i < n; i++) {
            const double rm = (double)b1 * m0[i] + (1.0 - b1) * g[i];
            const double rv = (double)b2 * v0[i] + (1.0 - b2) * (double)g[i] * g[i];
            const double mhat = rm / (1.0 - pow(b1, t)), vhat = rv / (1.0 - pow(b2, t));
            const double rp = p0[i] * (1.0 - (double)lr * wd) - lr * mhat / (sqrt(vhat) + eps);
            CHECK_NEAR_REL(m[i], rm, 1e-5, 1e-3); /* b1 m + (1-b1) g may cancel */
            CHECK_NEAR_REL(v[i], rv, 1e-5, 1e-9);
            CHECK_NEAR_REL(p[i], rp, 1e-5, 1e-2); /* p0 ~ 1 and the step may cancel: fp32's error at 1, ~1e-7 */
        }
        bfree(p), bfree(g), bfree(m), bfree(v), bfree(p0), bfree(m0), bfree(v0);
    }
}

/* The thread count changes no value: the matmuls (forward, input and weight gradients, with
 * and without the transposed weight, a bias) with 1 thread and with 2 agree bit
 * for bit (OpenBLAS's own threading does not: on an AMD EPYC the products changed with it, and
 * so did training under training.adapt_cpu_threads). Shapes from a GPT block, its head, and
 * generation (one row), and a head wider than its rows. */
static void test_thread_invariance(void) {
    if (!be->ops->set_threads || getenv("OMP_NUM_THREADS")) return; /* valgrind runs: one thread */
    /* (M, K, N): a block's products, the head, generation's few rows (tiles of columns), and a
     * wide head of 4 Mi weights (tiles of columns only: ops_cpu.c GEMM_WIDE_B) */
    const int shapes[][3] = {{2048, 64, 192}, {2048, 256, 64}, {2048, 64, 257}, {2048, 768, 50}, {1, 768, 5000},
                             {3, 64, 1025}, {200, 256, 16411}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        const int M = shapes[sh][0], K = shapes[sh][1], N = shapes[sh][2];
        for (int wt = 0; wt < 2; wt++) {
            float *inp = frandom((size_t)M * K, 1.0f), *w = frandom((size_t)K * N, 0.1f), *bias = frandom((size_t)N, 0.1f);
            float *dout = frandom((size_t)M * N, 1.0f), *out[2], *dinp[2], *dw[2], *db[2];
            for (int r = 0; r < 2; r++) {
                be->ops->set_threads(be->ctx, r ? 2 : 1);
                out[r] = falloc((size_t)M * N), dinp[r] = falloc((size_t)M * K);
                dw[r] = falloc((size_t)K * N), db[r] = falloc((size_t)N);
                memset(dw[r], 0, (size_t)K * N * sizeof(float));
                memset(db[r], 0, (size_t)N * sizeof(float));
                be->ops->matmul_fwd(be->ctx, A(out[r]), A(inp), w, bias, M, K, N, N, wt);
                be->ops->matmul_bwd(be->ctx, A(dinp[r]), dw[r], db[r], A(dout), A(inp), w, M, K, N, N, wt);
            }
            CHECK(memcmp(out[0], out[1], (size_t)M * N * sizeof(float)) == 0);
            CHECK(memcmp(dinp[0], dinp[1], (size_t)M * K * sizeof(float)) == 0);
            CHECK(memcmp(dw[0], dw[1], (size_t)K * N * sizeof(float)) == 0);
            CHECK(memcmp(db[0], db[1], (size_t)N * sizeof(float)) == 0);
            for (int r = 0; r < 2; r++) bfree(out[r]), bfree(dinp[r]), bfree(dw[r]), bfree(db[r]);
            bfree(inp), bfree(w), bfree(bias), bfree(dout);
        }
    }
    be->ops->set_threads(be->ctx, 2);
}

/* OpenBLAS's weight gradients that one tile would hold (64 rows or more, few columns: the shipped
 * fine-tune's) are split into tiles of columns (ops_cpu.c gemm_plan, PLAN_GRAD): each against its
 * sum in double, added onto what dW held, with the weight as it is and transposed; 4 tiles, 2
 * with a tail (70 columns: 48 + 22), and 256 rows: one oneDNN tile where it runs the fp32
 * products, 2 tiles under DTRAIN_CPU_GEMM=openblas (test_ops_cpu_openblas). */
static void test_weight_grad_tiles(void) {
    const int shapes[][3] = {{1024, 64, 192}, {300, 100, 70}, {512, 256, 64}, {700, 64, 64}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        const int M = shapes[sh][0], K = shapes[sh][1], N = shapes[sh][2];
        for (int wt = 0; wt < 2; wt++) {
            float *inp = frandom((size_t)M * K, 1.0f), *w = frandom((size_t)K * N, 0.1f);
            float *dout = frandom((size_t)M * N, 1.0f), *dw = frandom((size_t)K * N, 1.0f);
            float *dw0 = fcopy(dw, (size_t)K * N);
            be->ops->matmul_bwd(be->ctx, NULL, dw, NULL, A(dout), A(inp), w, M, K, N, N, wt);
            for (int k = 0; k < K; k++)
                for (int n = 0; n < N; n++) {
                    const size_t at = wt ? (size_t)n * K + k : (size_t)k * N + n;
                    double s = dw0[at];
                    for (int m = 0; m < M; m++) s += (double)inp[(size_t)m * K + k] * dout[(size_t)m * N + n];
                    CHECK_NEAR_REL(dw[at], s, 1e-5, sqrt((double)M));
                }
            bfree(inp), bfree(w), bfree(dout), bfree(dw), bfree(dw0);
        }
    }
}

/* matmul_bwd runs the tasks of its input gradient, weight gradient and bias sums in one parallel
 * region (the larger tiles first, on whichever thread is free): each gradient must have the bits
 * it has when asked for alone, on 1 thread and on 2, and the values of sums in double. Shapes:
 * the shipped fine-tune's mlp_out (its weight gradient one oneDNN tile beside 4 tiles of the
 * input gradient) and qkv (an OpenBLAS weight gradient in tiles of columns), tails both ways, and
 * one whose bias sums alone would stay on one thread. */
static void test_backward_jobs(void) {
    const int shapes[][3] = {{1024, 256, 64}, {1024, 64, 192}, {300, 100, 70}, {520, 272, 300}, {40, 24, 16}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        const int M = shapes[sh][0], K = shapes[sh][1], N = shapes[sh][2];
        const size_t nmk = (size_t)M * K, nkn = (size_t)K * N, nmn = (size_t)M * N;
        for (int wt = 0; wt < 2; wt++) {
            float *inp = frandom(nmk, 1.0f), *w = frandom(nkn, 0.1f), *dout = frandom(nmn, 1.0f);
            float *dw0 = frandom(nkn, 0.1f), *db0 = frandom((size_t)N, 0.1f);
            float *dinp[2], *dw[2], *db[2];
            for (int t = 0; t < 2; t++) { /* all three together, 1 thread then 2 */
                be->ops->set_threads(be->ctx, t + 1);
                dinp[t] = falloc(nmk), dw[t] = fcopy(dw0, nkn), db[t] = fcopy(db0, (size_t)N);
                be->ops->matmul_bwd(be->ctx, A(dinp[t]), dw[t], db[t], A(dout), A(inp), w, M, K, N, N, wt);
            }
            float *dinp_a = falloc(nmk), *dw_a = fcopy(dw0, nkn), *db_a = fcopy(db0, (size_t)N);
            be->ops->matmul_bwd(be->ctx, A(dinp_a), NULL, NULL, A(dout), A(inp), w, M, K, N, N, wt);
            be->ops->matmul_bwd(be->ctx, NULL, dw_a, NULL, A(dout), A(inp), w, M, K, N, N, wt);
            be->ops->matmul_bwd(be->ctx, NULL, NULL, db_a, A(dout), A(inp), w, M, K, N, N, wt);
            for (int t = 0; t < 2; t++) {
                CHECK(memcmp(dinp[t], dinp_a, nmk * sizeof(float)) == 0);
                CHECK(memcmp(dw[t], dw_a, nkn * sizeof(float)) == 0);
                CHECK(memcmp(db[t], db_a, (size_t)N * sizeof(float)) == 0);
            }
            for (int m = 0; m < M; m += 7) /* every 7th row of the input gradient, every weight and bias gradient */
                for (int k = 0; k < K; k++) {
                    double s = 0;
                    for (int n = 0; n < N; n++) s += (double)dout[(size_t)m * N + n] * w[wt ? (size_t)n * K + k : (size_t)k * N + n];
                    CHECK_NEAR_REL(dinp[1][(size_t)m * K + k], s, 1e-5, sqrt((double)N));
                }
            for (int k = 0; k < K; k++)
                for (int n = 0; n < N; n++) {
                    const size_t at = wt ? (size_t)n * K + k : (size_t)k * N + n;
                    double s = dw0[at];
                    for (int m = 0; m < M; m++) s += (double)inp[(size_t)m * K + k] * dout[(size_t)m * N + n];
                    CHECK_NEAR_REL(dw[1][at], s, 1e-5, sqrt((double)M));
                }
            for (int n = 0; n < N; n++) {
                double s = db0[n];
                for (int m = 0; m < M; m++) s += dout[(size_t)m * N + n];
                CHECK_NEAR_REL(db[1][n], s, 1e-5, sqrt((double)M));
            }
            for (int t = 0; t < 2; t++) bfree(dinp[t]), bfree(dw[t]), bfree(db[t]);
            bfree(inp), bfree(w), bfree(dout), bfree(dw0), bfree(db0), bfree(dinp_a), bfree(dw_a), bfree(db_a);
        }
    }
    be->ops->set_threads(be->ctx, 2);
}

/* xent_fused (what training takes) gives what xent_fwd then xent_bwd give, bit for bit, on 1 and
 * 2 threads, on wide rows ld apart: whole chunks and a tail, ignored rows, and the columns past V
 * untouched */
static void test_xent_fused_wide(void) {
    enum { N = 33, V = 1025, LD = 1040 };
    const float scale = 1.0f / 3.0f; /* not a power of two: p * inv * scale rounds twice, as the two calls do */
    int tg[N];
    for (int i = 0; i < N; i++) tg[i] = i % 5 == 3 ? -1 : (i * 97) % V;
    float *logits = frandom((size_t)N * LD, 4.0f), *two = fcopy(logits, (size_t)N * LD);
    float *one = fcopy(logits, (size_t)N * LD), *l2 = falloc(N), *l1 = falloc(N);
    be->ops->xent_fwd(be->ctx, l2, A(two), A(two), tg, N, V, LD);
    be->ops->xent_bwd(be->ctx, A(two), A(two), tg, scale, N, V, LD);
    for (int t = 1; t <= 2; t++) {
        be->ops->set_threads(be->ctx, t);
        memcpy(one, logits, (size_t)N * LD * sizeof(float));
        be->ops->xent_fused(be->ctx, l1, A(one), A(one), tg, scale, N, V, LD);
        CHECK(memcmp(l1, l2, N * sizeof(float)) == 0);
        CHECK(memcmp(one, two, (size_t)N * LD * sizeof(float)) == 0); /* past V: logits' own values */
    }
    be->ops->set_threads(be->ctx, 2);
    bfree(logits), bfree(two), bfree(one), bfree(l2), bfree(l1);
}

/* training.precision bf16 (oneDNN, where the CPU has AVX512-BF16 or AMX): matmul_fwd and
 * matmul_bwd multiply their inputs rounded to bf16 with fp32 accumulation. Against the fp32
 * backend on inputs rounded beforehand: equal within fp32 rounding (the sums' order differs);
 * 1 and 2 threads bit for bit; a product of fewer than 256 rows of the batch (a forward's or
 * input gradient's rows, a weight gradient's sum) runs in fp32, exactly as the fp32 backend's.
 * Where the CPU or the build has none, open refuses, naming why, and the rest is skipped (said
 * on stdout). */
static void test_bf16_products(void) {
    dt_backend_cfg bc = {.threads = 2, .precision = 1};
    dt_backend *b16 = NULL;
    if (dt_backend_open(DT_DEVICE_CPU, &bc, &b16) != DT_OK) {
        printf("test_ops_cpu: bf16 products not tested: %s\n", dt_error_msg());
        CHECK(strstr(dt_error_msg(), "needs AVX512-BF16 or AMX") || strstr(dt_error_msg(), "built without it"));
        return;
    }
    /* (M, K, N): 4 tiles of rows, with a weight gradient of 80 x 96 in bf16 (its sum is over
     * the 1024 rows); one tile with the weight gradient's 300 rows; 257 rows of a transposed
     * weight's gradient; tiles of columns, and weight gradients in 2 x 2 tiles with tails both
     * ways (1 x 4 with the weight transposed; their A read transposed, in place); weights of 260
     * and 300 rows whose products sum over 200 rows, too few for bf16; and a product too small
     * for bf16. Each backward also once for each gradient alone: the weight gradient reuses the
     * input gradient's bf16 copy of dout, and must give the bits it gives alone. */
    const int shapes[][3] = {{1024, 96, 80}, {512, 300, 64}, {300, 128, 257}, {256, 600, 300}, {200, 300, 260},
                             {100, 64, 64}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        const int M = shapes[sh][0], K = shapes[sh][1], N = shapes[sh][2];
        for (int wt = 0; wt < 2; wt++) {
            const size_t nmk = (size_t)M * K, nkn = (size_t)K * N, nmn = (size_t)M * N;
            float *inp = frandom(nmk, 1.0f), *w = frandom(nkn, 0.1f), *bias = frandom((size_t)N, 0.1f);
            float *dout = frandom(nmn, 1.0f), *dw0 = frandom(nkn, 0.1f);
            float *r_inp = fcopy(inp, nmk), *r_w = fcopy(w, nkn), *r_dout = fcopy(dout, nmn);
            dt_bf16_round_all(r_inp, nmk), dt_bf16_round_all(r_w, nkn), dt_bf16_round_all(r_dout, nmn);
            /* references from the fp32 backend: [0] on the rounded inputs, [1] on the inputs as they are */
            float *out_r[2], *dinp_r[2], *dw_r[2], *out[2], *dinp[2], *dw[2];
            for (int r = 0; r < 2; r++) {
                out_r[r] = falloc(nmn), dinp_r[r] = falloc(nmk), dw_r[r] = fcopy(dw0, nkn);
                be->ops->matmul_fwd(be->ctx, A(out_r[r]), A(r ? inp : r_inp), r ? w : r_w, bias, M, K, N, N, wt);
                be->ops->matmul_bwd(be->ctx, A(dinp_r[r]), dw_r[r], NULL, A(r ? dout : r_dout), A(r ? inp : r_inp),
                                    r ? w : r_w, M, K, N, N, wt);
            }
            for (int t = 0; t < 2; t++) { /* 1 thread, then 2 */
                b16->ops->set_threads(b16->ctx, t + 1);
                out[t] = falloc(nmn), dinp[t] = falloc(nmk), dw[t] = fcopy(dw0, nkn);
                b16->ops->matmul_fwd(b16->ctx, A(out[t]), A(inp), w, bias, M, K, N, N, wt);
                b16->ops->matmul_bwd(b16->ctx, A(dinp[t]), dw[t], NULL, A(dout), A(inp), w, M, K, N, N, wt);
            }
            CHECK(memcmp(out[0], out[1], nmn * sizeof(float)) == 0);
            CHECK(memcmp(dinp[0], dinp[1], nmk * sizeof(float)) == 0);
            CHECK(memcmp(dw[0], dw[1], nkn * sizeof(float)) == 0);
            {
                float *dinp_a = falloc(nmk), *dw_a = fcopy(dw0, nkn);
                b16->ops->matmul_fwd(b16->ctx, A(out[0]), A(inp), w, bias, M, K, N, N, wt); /* other copies made last */
                b16->ops->matmul_bwd(b16->ctx, NULL, dw_a, NULL, A(dout), A(inp), w, M, K, N, N, wt);
                b16->ops->matmul_bwd(b16->ctx, A(dinp_a), NULL, NULL, A(dout), A(inp), w, M, K, N, N, wt);
                CHECK(memcmp(dinp_a, dinp[1], nmk * sizeof(float)) == 0);
                CHECK(memcmp(dw_a, dw[1], nkn * sizeof(float)) == 0);
                bfree(dinp_a), bfree(dw_a);
            }
            /* the rows of each product's output: which reference it matches */
            const int fwd16 = M >= 256, dw16 = fwd16; /* a weight gradient's sum is over the same M rows */
            const float *ro = out_r[!fwd16], *ri = dinp_r[!fwd16], *rw = dw_r[!dw16];
            for (size_t i = 0; i < nmn; i++) {
                if (fwd16) CHECK_NEAR_REL(out[1][i], ro[i], 1e-5, 0.1);
                else CHECK(out[1][i] == ro[i]);
            }
            for (size_t i = 0; i < nmk; i++) {
                if (fwd16) CHECK_NEAR_REL(dinp[1][i], ri[i], 1e-5, 0.1);
                else CHECK(dinp[1][i] == ri[i]);
            }
            for (size_t i = 0; i < nkn; i++) {
                if (dw16) CHECK_NEAR_REL(dw[1][i], rw[i], 1e-5, 1.0);
                else CHECK(dw[1][i] == rw[i]);
            }
            /* and bf16 is not fp32: somewhere the rounded inputs moved an output */
            if (fwd16) CHECK(memcmp(out[1], out_r[1], nmn * sizeof(float)) != 0);
            /* a weight kept in bf16 (model.lora.base_dtype): matmul16's products read it as it is
             * and give, bit for bit, what matmul gives with that weight widened to fp32 */
            if (fwd16) {
                uint16_t *w16 = balloc(nkn * sizeof(uint16_t));
                dt_bf16_pack(w16, w, nkn);
                CHECK_INT_EQ(b16->ops->reserve(b16->ctx, &(dt_op_sizes){.base16 = nkn}), DT_OK);
                float *o16 = falloc(nmn), *ow = falloc(nmn), *d16 = falloc(nmk), *dw_ = falloc(nmk);
                b16->ops->matmul16_fwd(b16->ctx, A(o16), A(inp), w16, bias, M, K, N, N, wt);
                b16->ops->matmul_fwd(b16->ctx, A(ow), A(inp), r_w, bias, M, K, N, N, wt);
                b16->ops->matmul16_bwd(b16->ctx, A(d16), A(dout), w16, M, K, N, N, wt);
                b16->ops->matmul_bwd(b16->ctx, A(dw_), NULL, NULL, A(dout), A(inp), r_w, M, K, N, N, wt);
                CHECK(memcmp(o16, ow, nmn * sizeof(float)) == 0);
                CHECK(memcmp(d16, dw_, nmk * sizeof(float)) == 0);
                bfree(w16), bfree(o16), bfree(ow), bfree(d16), bfree(dw_);
            }
            for (int r = 0; r < 2; r++)
                bfree(out_r[r]), bfree(dinp_r[r]), bfree(dw_r[r]), bfree(out[r]), bfree(dinp[r]), bfree(dw[r]);
            bfree(inp), bfree(w), bfree(bias), bfree(dout), bfree(dw0), bfree(r_inp), bfree(r_w), bfree(r_dout);
        }
    }
    dt_backend_desc d;
    b16->ops->describe(b16->ctx, &d);
    CHECK_STR_CONTAINS(d.per_worker, "bf16 products");
    dt_backend_close(b16);
}

/* |a - ref| within tol of ref's largest magnitude, everywhere; 1 where a differs from ref somewhere */
static int near_maxnorm(const char *what, const float *a, const float *ref, size_t n, double tol) {
    double big = 0.0;
    int differs = 0;
    for (size_t i = 0; i < n; i++) big = fmax(big, fabs((double)ref[i]));
    for (size_t i = 0; i < n; i++) {
        differs |= a[i] != ref[i];
        if (!(fabs((double)a[i] - ref[i]) <= tol * big)) {
            fprintf(stderr, "%s[%zu]: %.9g against %.9g (largest %.3g)\n", what, i, a[i], ref[i], big);
            CHECK(0);
            break;
        }
    }
    return differs;
}

/* training.precision bf16: attention's products take bf16 inputs with fp32 accumulation where
 * the sequences have 64 rows or more and the heads 64 elements or more, or 32 at 256 rows or more
 * (ops_cpu.c att16_runs).
 * Against the fp32 backend on the same inputs: the output, the probabilities and dqkv within
 * bf16's rounding (2-3% of the largest magnitude) and not equal to fp32's; the probabilities and
 * their gradient exact zeros wherever fp32's are (above the diagonal, outside a packed row's
 * example); 1 and 2 threads bit for bit; below those sizes, fp32's bits. */
static void test_bf16_attention(void) {
    dt_backend_cfg bc = {.threads = 2, .precision = 1};
    dt_backend *b16 = NULL;
    if (dt_backend_open(DT_DEVICE_CPU, &bc, &b16) != DT_OK) {
        printf("test_ops_cpu: bf16 attention not tested: %s\n", dt_error_msg());
        return;
    }
    const struct {
        int B, T, NH, NKV, hs, bf16, n_ex, starts[3];
    } cases[] = {
        {2, 64, 2, 2, 64, 1, 0, {0}},           /* one block */
        {1, 100, 4, 2, 64, 1, 0, {0}},          /* grouped heads, a part block last */
        {1, 320, 2, 1, 64, 1, 0, {0}},          /* more keys and queries than a product takes at once */
        {1, 300, 4, 2, 32, 1, 3, {0, 37, 230}}, /* heads of 32 at 256 rows or more; packed rows: blocks
                                                    that start inside an example */
        {2, 48, 2, 2, 64, 0, 0, {0}},           /* fewer than 64 rows: fp32 */
        {1, 128, 2, 2, 32, 0, 0, {0}},          /* heads of 32 at fewer than 256 rows: fp32 */
        {1, 80, 2, 2, 16, 0, 0, {0}},           /* heads of 16: fp32 */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const int B = cases[c].B, T = cases[c].T, NH = cases[c].NH;
        att_state s;
        att_state_init(&s, B, T, NH, cases[c].NKV, cases[c].hs, 2.0f);
        int *pos = NULL;
        if (cases[c].n_ex) {
            pos = ialloc((size_t)T);
            for (int e = 0; e < cases[c].n_ex; e++)
                for (int t = cases[c].starts[e]; t < (e + 1 < cases[c].n_ex ? cases[c].starts[e + 1] : T); t++)
                    pos[t] = t - cases[c].starts[e];
            s.sh.pos = pos;
        }
        const size_t nqkv = (size_t)B * T * s.W, nout = (size_t)B * T * s.HQ, natt = (size_t)B * NH * T * T;
        float *dqkv = falloc(nqkv), *datt = falloc(natt), *out[2], *att[2], *dq[2], *da[2];
        be->ops->attention_fwd(be->ctx, A(s.out), A(s.att), A(s.qkv), &s.sh);
        be->ops->attention_bwd(be->ctx, A(dqkv), A(datt), A(s.R), A(s.qkv), A(s.out), A(s.att), &s.sh);
        for (int t = 0; t < 2; t++) { /* 1 thread, then 2 */
            b16->ops->set_threads(b16->ctx, t + 1);
            out[t] = falloc(nout), att[t] = falloc(natt), dq[t] = falloc(nqkv), da[t] = falloc(natt);
            ffill(out[t], nout, GARBAGE), ffill(att[t], natt, NAN), ffill(dq[t], nqkv, GARBAGE), ffill(da[t], natt, NAN);
            b16->ops->attention_fwd(b16->ctx, A(out[t]), A(att[t]), A(s.qkv), &s.sh);
            b16->ops->attention_bwd(b16->ctx, A(dq[t]), A(da[t]), A(s.R), A(s.qkv), A(out[t]), A(att[t]), &s.sh);
        }
        CHECK(memcmp(out[0], out[1], nout * sizeof(float)) == 0);
        CHECK(memcmp(att[0], att[1], natt * sizeof(float)) == 0);
        CHECK(memcmp(dq[0], dq[1], nqkv * sizeof(float)) == 0);
        if (cases[c].bf16) {
            CHECK(near_maxnorm("bf16 attention out", out[1], s.out, nout, 2e-2));
            CHECK(near_maxnorm("bf16 attention probabilities", att[1], s.att, natt, 2e-2));
            CHECK(near_maxnorm("bf16 attention dqkv", dq[1], dqkv, nqkv, 3e-2));
            for (size_t i = 0; i < natt; i++)
                if (s.att[i] == 0.0f) CHECK(att[1][i] == 0.0f && da[1][i] == 0.0f);
        } else {
            CHECK(memcmp(out[1], s.out, nout * sizeof(float)) == 0);
            CHECK(memcmp(att[1], s.att, natt * sizeof(float)) == 0);
            CHECK(memcmp(dq[1], dqkv, nqkv * sizeof(float)) == 0);
        }
        for (int t = 0; t < 2; t++) bfree(out[t]), bfree(att[t]), bfree(dq[t]), bfree(da[t]);
        bfree(dqkv), bfree(datt);
        if (pos) bfree(pos);
        s.sh.pos = NULL;
        att_state_free(&s);
    }
    dt_backend_close(b16);
}

/* fp32 products on oneDNN (the default where dtrain is built with it) against OpenBLAS's
 * (DTRAIN_CPU_GEMM=openblas): the same values within fp32 rounding, on a block's products, the
 * head, a wide head (tiles of columns only), with a bias and accumulating weight gradients;
 * products of fewer than 256 rows (generation's one row, a product too thin for a tile) run on
 * OpenBLAS in both, bit for bit. `dtrain --version`'s oneDNN line says
 * which runs them; a DTRAIN_CPU_GEMM other than those two is refused by name. Where this test
 * already runs on OpenBLAS (ctest's test_ops_cpu_openblas) or dtrain has no oneDNN, only the
 * refusal is tested. */
static void test_fp32_gemm_choice(void) {
    char was_s[64] = ""; /* as ctest set it (test_ops_cpu_openblas), restored after each change */
    const char *was = getenv("DTRAIN_CPU_GEMM") ? strncat(was_s, getenv("DTRAIN_CPU_GEMM"), 63) : NULL;
    dt_backend *other = NULL;
    dt_backend_cfg bc = {.threads = getenv("OMP_NUM_THREADS") ? 0 : 2};
    setenv("DTRAIN_CPU_GEMM", "mkl", 1);
    CHECK(dt_backend_open(DT_DEVICE_CPU, &bc, &other) != DT_OK);
    CHECK_STR_CONTAINS(dt_error_msg(), "DTRAIN_CPU_GEMM: expected openblas or onednn, got 'mkl'");
    char v[512] = "";
    if (was) setenv("DTRAIN_CPU_GEMM", was, 1);
    else unsetenv("DTRAIN_CPU_GEMM");
    be->ops->versions(v, sizeof v);
    if (!strstr(v, "fp32 products: oneDNN")) {
        printf("test_ops_cpu: fp32 products on OpenBLAS:%s", v);
        CHECK(strstr(v, "not built in") || strstr(v, "fp32 products: OpenBLAS (no AVX2 here)") ||
              (was && strstr(v, "fp32 products: OpenBLAS (DTRAIN_CPU_GEMM=openblas)")));
        return;
    }
    setenv("DTRAIN_CPU_GEMM", "openblas", 1);
    CHECK_INT_EQ(dt_backend_open(DT_DEVICE_CPU, &bc, &other), DT_OK);
    be->ops->versions(v, sizeof v);
    CHECK_STR_CONTAINS(v, "fp32 products: OpenBLAS (DTRAIN_CPU_GEMM=openblas)");
    if (was) setenv("DTRAIN_CPU_GEMM", was, 1);
    else unsetenv("DTRAIN_CPU_GEMM");
    int differ = 0; /* somewhere the two libraries round differently: the comparison is of two */
    /* (M, K, N): a block's products; the head; tiles of rows and of columns with tails both ways
     * (304 and 296 each); a wide head, tiled by columns only; generation's one row, too thin a
     * product, and a wide head's 200 rows, which stay on OpenBLAS */
    const int shapes[][3] = {{2048, 64, 192}, {1024, 256, 1025}, {600, 64, 600},  {256, 256, 16411},
                             {1, 768, 500},   {100, 64, 8},      {200, 256, 16411}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        const int M = shapes[sh][0], K = shapes[sh][1], N = shapes[sh][2];
        for (int wt = 0; wt < 2; wt++) {
            const size_t nmk = (size_t)M * K, nkn = (size_t)K * N, nmn = (size_t)M * N;
            float *inp = frandom(nmk, 1.0f), *w = frandom(nkn, 0.1f), *bias = frandom((size_t)N, 0.1f);
            float *dout = frandom(nmn, 1.0f), *dw0 = frandom(nkn, 0.1f), *out[2], *dinp[2], *dw[2];
            for (int r = 0; r < 2; r++) {
                dt_backend *b = r ? other : be;
                out[r] = falloc(nmn), dinp[r] = falloc(nmk), dw[r] = fcopy(dw0, nkn);
                b->ops->matmul_fwd(b->ctx, A(out[r]), A(inp), w, bias, M, K, N, N, wt);
                b->ops->matmul_bwd(b->ctx, A(dinp[r]), dw[r], NULL, A(dout), A(inp), w, M, K, N, N, wt);
            }
            /* the same sums in another order: within 1e-5 of the larger of the value and the sum's
             * typical size (sqrt of its count of terms, times 0.1 where the weight is a factor) */
            for (size_t i = 0; i < nmn; i++) CHECK_NEAR_REL(out[0][i], out[1][i], 1e-5, 0.1 * sqrt((double)K));
            for (size_t i = 0; i < nmk; i++) CHECK_NEAR_REL(dinp[0][i], dinp[1][i], 1e-5, 0.1 * sqrt((double)N));
            for (size_t i = 0; i < nkn; i++) CHECK_NEAR_REL(dw[0][i], dw[1][i], 1e-5, sqrt((double)M));
            differ |= memcmp(out[0], out[1], nmn * sizeof(float)) || memcmp(dinp[0], dinp[1], nmk * sizeof(float)) ||
                      memcmp(dw[0], dw[1], nkn * sizeof(float));
            if (M < 256) { /* fewer rows than a tile: OpenBLAS in both, bit for bit (so are the
                              weight gradients with fewer than 256 rows, K or N here) */
                CHECK(memcmp(out[0], out[1], nmn * sizeof(float)) == 0);
                CHECK(memcmp(dinp[0], dinp[1], nmk * sizeof(float)) == 0);
            }
            if ((wt ? N : K) < 256) CHECK(memcmp(dw[0], dw[1], nkn * sizeof(float)) == 0);
            for (int r = 0; r < 2; r++) bfree(out[r]), bfree(dinp[r]), bfree(dw[r]);
            bfree(inp), bfree(w), bfree(bias), bfree(dout), bfree(dw0);
        }
    }
    CHECK(differ);
    /* the primitives' table filled (more than its 128 shapes) and emptied: a product whose shape comes
     * after that still runs on oneDNN and gives the bits a fresh process gives, never depending on
     * what ran before (a full table once sent new shapes to OpenBLAS) */
    {
        const int M = 256, K = 768, N = 96;
        float *inp = frandom((size_t)M * K, 1.0f), *w = frandom((size_t)K * N, 0.1f);
        float *fresh = falloc((size_t)M * N), *after = falloc((size_t)M * N), *o = falloc((size_t)M * 108);
        float *wb = frandom((size_t)K * 108, 0.1f), *ob = falloc((size_t)M * N);
        for (int k = 512; k <= K; k += 128) /* 204 new shapes, one tile each */
            for (int n = 40; n < 108; n++) be->ops->matmul_fwd(be->ctx, A(o), A(inp), wb, NULL, M, k, n, n, 0);
        be->ops->matmul_fwd(be->ctx, A(after), A(inp), w, NULL, M, K, N, N, 0);
        dt_backend *be2 = NULL;
        CHECK_INT_EQ(dt_backend_open(DT_DEVICE_CPU, &bc, &be2), DT_OK);
        be2->ops->matmul_fwd(be2->ctx, A(fresh), A(inp), w, NULL, M, K, N, N, 0);
        other->ops->matmul_fwd(other->ctx, A(ob), A(inp), w, NULL, M, K, N, N, 0);
        CHECK(memcmp(fresh, after, (size_t)M * N * sizeof(float)) == 0);
        CHECK(memcmp(fresh, ob, (size_t)M * N * sizeof(float)) != 0); /* and it is oneDNN's, not OpenBLAS's */
        dt_backend_close(be2);
        bfree(inp), bfree(w), bfree(fresh), bfree(after), bfree(o), bfree(wb), bfree(ob);
    }
    dt_backend_close(other);
}

/* The bf16 array loops (src/base/bf16.c: the loader picks the AVX-512, AVX2 or plain build of
 * each) give the scalar conversions' bits: ties to even, NaN made quiet, infinities, zeros and
 * subnormals, on lengths and offsets that leave vector tails. */
static void test_bf16_arrays(void) {
    enum { N = 4099 };
    static const uint32_t edge[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x3f808000u, 0x3f818000u,
                                    0x3f80ffffu, 0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7f800001u,
                                    0xff800001u, 0x7fc00000u, 0xffffffffu, 0x7f7f8000u, 0x477fe000u, 0xc77f8000u};
    float *src = falloc(N), *got = falloc(N), *acc = falloc(N), *want = falloc(N);
    uint16_t *b = balloc(N * sizeof(uint16_t));
    for (int i = 0; i < N; i++) {
        const uint32_t u = i < (int)(sizeof edge / sizeof *edge) ? edge[i] : rnext();
        memcpy(&src[i], &u, sizeof u);
    }
    for (int off = 0; off < 3; off++) {
        const size_t n = (size_t)N - 2 * (size_t)off;
        dt_bf16_pack(b + off, src + off, n);
        for (size_t i = 0; i < n; i++) CHECK_INT_EQ(b[off + i], dt_float_to_bf16(src[off + i]));
        dt_bf16_unpack(got + off, b + off, n);
        for (size_t i = 0; i < n; i++) {
            const float w = dt_bf16_to_float(b[off + i]);
            CHECK(memcmp(&got[off + i], &w, sizeof w) == 0);
        }
        memcpy(got, src, N * sizeof(float));
        dt_bf16_round_all(got + off, n);
        for (size_t i = 0; i < n; i++) {
            const float w = dt_bf16_round(src[off + i]);
            CHECK(memcmp(&got[off + i], &w, sizeof w) == 0);
        }
        for (int i = 0; i < N; i++) acc[i] = want[i] = (float)(i % 13) - 6.0f;
        dt_bf16_add(acc + off, b + off, n);
        for (size_t i = 0; i < n; i++) want[off + i] += dt_bf16_to_float(b[off + i]);
        CHECK(memcmp(acc, want, N * sizeof(float)) == 0);
    }
    free(src); free(got); free(acc); free(want); free(b);
}

int main(void) {
    /* two threads, unless OMP_NUM_THREADS says otherwise (valgrind runs use 1) */
    dt_backend_cfg bc = {.threads = getenv("OMP_NUM_THREADS") ? 0 : 2};
    CHECK_INT_EQ(dt_backend_open(DT_DEVICE_CPU, &bc, &be), DT_OK);
    CHECK_STR_EQ(be->ops->name, "cpu");
    test_memory();
    test_encoder();
    test_encoder_determinism();
    test_layernorm();
    test_matmul();
    test_attention();
    test_attention_determinism();
    test_rmsnorm();
    test_rope();
    test_swiglu();
    test_thread_invariance();
    test_fp32_gemm_choice();
    test_bf16_products();
    test_bf16_attention();
    test_bf16_arrays();
    test_gelu_add();
    test_xent();
    test_vocab_shares();
    test_gather_scatter();
    test_argmax_check();
    test_strided_logits();
    test_adamw();
    test_sumsq_scale();
    test_optimizer_bits();
    test_weight_grad_tiles();
    test_backward_jobs();
    test_xent_fused_wide();
    test_loss_sum();
    test_large_sizes();
    dt_backend_close(be);
    dt_backend_close(NULL);
    TEST_PASS("test_ops_cpu");
}
