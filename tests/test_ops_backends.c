/* test_ops_backends.c — (label gpu) every op of every non-CPU backend the registry can open
 * (backend.h: cuda, where built and a GPU is visible), against the CPU backend, the reference,
 * on fresh random inputs; then the whole model's loss and gradients, and a few AdamW steps.
 * The cases are one table (`cases` below): op, shapes (full and --quick), fp32 and bf16
 * tolerances. Each device backend runs at fp32 and, where it has them, with bf16 products.
 *
 *   test_ops_backends [--quick] [--op NAME[,NAME...]] [--list]
 *
 * --quick: smaller shapes (for compute-sanitizer and the mock GPU's ASan build); --op: only the
 * cases of these ops (--list names them). Exits 77 when no non-CPU backend can be opened here.
 * Without a GPU, ctest's test_cuda_mock runs this file on CPU mocks (tests/mockgpu).
 *
 * Besides realistic shapes, edge cases: sizes of 1, odd widths (unaligned rows, and biases
 * inside the parameter buffer that are only 4-byte aligned), empty inputs, a layernorm row whose
 * mean dwarfs its spread, NaN, -inf and ties in argmax, the NULL gradients ops.h allows. The
 * Llama family's ops too (RMSNorm, RoPE from a position > 0, SwiGLU, the encoder without wpe,
 * grouped-query attention with head sizes cuDNN plans and refuses, cached and not) and whole
 * Llama models; a backend may lack those ops (ops.h), the CUDA one may not.
 *
 * Error measure: relative L2, ||dev - cpu|| / max(||cpu||, 1e-30). Tolerances: fp32 1e-5 for
 * single ops (3e-5 where a long reduction is summed in another order), bf16 1e-2 for the
 * products (inputs rounded to 8 bits of mantissa), and for the model's gradients through two
 * layers 1e-4 (fp32) and 5e-2 (bf16). With bf16 products the device's activations are bf16, so
 * its activation inputs are rounded to bf16 for both backends, and every op that reads or writes
 * activations is compared at a bf16 tolerance (1e-2: what storing a result in bf16 costs);
 * ops that touch none (sumsq, AdamW) run at fp32 only. Parameter-
 * gradient ops start from non-zero gradients, so an op that overwrites instead of accumulating
 * fails. Reductions must be deterministic: the ones that promise it are run twice and compared
 * bit for bit. Activations travel in the device backend's element type (act_dtype): values are
 * packed into it on upload and unpacked on download, so the comparisons hold for any. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtrain/backend.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"

static dt_backend *g_ref, *g_dev; /* the CPU reference, the backend under test */
static dt_dtype g_act;            /* the device backend's activation element */
static int g_quick;
static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static int g_failures;

/* ops of the reference and of the backend under test, on their own state */
#define REF(op, ...) g_ref->ops->op(g_ref->ctx, __VA_ARGS__)
#define DEV(op, ...) g_dev->ops->op(g_dev->ctx, __VA_ARGS__)

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

/* Packed rows' positions (ops.h dt_att_shape pos): each of B rows of T filled with examples of
 * 1..T/2+1 rows, the last one cut at the row's end; every row's first example starts at 0. */
static int *rand_packed_pos(int B, int T) {
    int *p = malloc(((size_t)B * T + 1) * sizeof(int));
    CHECK(p);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T;) {
            const int len = 1 + (int)(urand() * (T / 2 + 1));
            for (int i = 0; i < len && t < T; i++, t++) p[(size_t)b * T + t] = i;
        }
    return p;
}

/* ---- tensors held by both backends ---- */

enum { K_F32, K_ACT, K_I32 }; /* parameters/statistics, activations, indices */

typedef struct pair {
    void *c, *g;  /* reference (host memory: the CPU backend's), device */
    size_t n;     /* elements */
    int kind;
} pair;

static size_t dev_bytes(const pair *p) { return p->n * (p->kind == K_ACT ? dt_dtype_size(g_act) : 4); }

/* float -> bf16, round to nearest even (NaN stays NaN) */
static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
static float from_bf16(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* host floats into the device's layout of p (packed when its activations are bf16) */
static void dev_upload(const pair *p, const void *host) {
    if (p->kind != K_ACT || g_act == DT_DTYPE_F32) {
        DEV(upload, p->g, host, dev_bytes(p));
        return;
    }
    uint16_t *b = malloc(p->n * sizeof *b + 1);
    CHECK(b);
    for (size_t i = 0; i < p->n; i++) b[i] = to_bf16(((const float *)host)[i]);
    DEV(upload, p->g, b, dev_bytes(p));
    free(b);
}

static void dev_ok(void) {
    if (g_dev->ops->check(g_dev->ctx) != DT_OK) {
        fprintf(stderr, "%s op failed: %s\n", g_dev->ops->name, dt_error_msg());
        exit(1);
    }
}

/* the device copy as floats (or ints) */
static void *dev_download(const pair *p) {
    void *raw = malloc(dev_bytes(p) + 1);
    CHECK(raw);
    DEV(download, raw, p->g, dev_bytes(p));
    dev_ok();
    if (p->kind != K_ACT || g_act == DT_DTYPE_F32) return raw;
    float *f = malloc(p->n * sizeof(float) + 1);
    CHECK(f);
    for (size_t i = 0; i < p->n; i++) f[i] = from_bf16(((const uint16_t *)raw)[i]);
    free(raw);
    return f;
}

/* An input held by both; activations of a bf16 device are rounded to bf16 for the reference
 * too, so that both compute from the same values and differ only by what each stores. */
static pair pair_new(int kind, const void *host, size_t n) {
    pair p = {NULL, NULL, n, kind};
    CHECK(REF(alloc, n * 4, "test", &p.c) == DT_OK);
    if (DEV(alloc, dev_bytes(&p), "test", &p.g) != DT_OK) {
        fprintf(stderr, "%s\n", dt_error_msg());
        exit(1);
    }
    if (host) {
        float *r = NULL;
        if (kind == K_ACT && g_act == DT_DTYPE_BF16) {
            CHECK((r = malloc(n * sizeof *r + 1)));
            for (size_t i = 0; i < n; i++) r[i] = from_bf16(to_bf16(((const float *)host)[i]));
            host = r;
        }
        REF(upload, p.c, host, n * 4);
        dev_upload(&p, host);
        free(r);
    }
    return p;
}
static pair pair_rand(int kind, size_t n, float lo, float hi) {
    float *h = rand_host(n, lo, hi);
    pair p = pair_new(kind, h, n);
    free(h);
    return p;
}
/* n multiples of 1/64 in [-1, 1]: exact in bf16, so a sum of a few products of them is exact
 * in fp32 too */
static pair pair_grid(int kind, size_t n) {
    float *h = rand_host(n, -1, 1);
    for (size_t i = 0; i < n; i++) h[i] = roundf(h[i] * 64) / 64;
    pair p = pair_new(kind, h, n);
    free(h);
    return p;
}
static pair pair_ints(const int *h, size_t n) { return pair_new(K_I32, h, n); }
static void pair_free(pair *p) {
    REF(free, p->c);
    DEV(free, p->g);
}
/* arguments: a pair as the reference's / the device's activation, float or int buffer */
#define CA(p) ((dt_act *)(p).c)
#define GA(p) ((dt_act *)(p).g)
#define CF(p) ((float *)(p).c)
#define GF(p) ((float *)(p).g)

/* relative L2 error of the device copy against the reference copy of the first n floats;
 * prints and counts a failure above tol */
/* compare's relative L2 with each reference value counted as at least `floor` in the norm: for
 * values whose fp32 rounding is absolute, not relative (a cross-entropy loss is the log of a sum
 * >= 1: a loss of 0.003 carries the ~1e-7 of that sum's rounding, 3e-5 of itself) */
static double compare_floor(const char *what, const pair *p, size_t n, double tol, double floor) {
    float *g = dev_download(p);
    const float *c = p->c;
    double num = 0, den = 0, worst = 0;
    size_t at = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        double d = (double)g[i] - (double)c[i];
        if (!isfinite(g[i])) finite = 0;
        num += d * d;
        den += fmax((double)c[i] * c[i], floor * floor);
        if (fabs(d) > worst) { worst = fabs(d); at = i; }
    }
    double rel = sqrt(num) / fmax(sqrt(den), 1e-30);
    int ok = finite && rel <= tol;
    printf("  %-44s rel L2 %.3e (tol %.0e)%s", what, rel, tol, ok ? "\n" : "  FAIL");
    if (!ok) {
        printf(" worst at %zu: %s %.9g cpu %.9g%s\n", at, g_dev->ops->name, n ? g[at] : 0.0f, n ? c[at] : 0.0f,
               finite ? "" : " (non-finite values)");
        g_failures++;
    }
    free(g);
    return rel;
}

static double compare(const char *what, const pair *p, size_t n, double tol) { return compare_floor(what, p, n, tol, 0); }

static void compare_ints(const char *what, const pair *p) {
    int *g = dev_download(p);
    size_t bad = 0;
    for (size_t i = 0; i < p->n; i++) bad += g[i] != ((int *)p->c)[i];
    printf("  %-44s %zu of %zu differ%s\n", what, bad, p->n, bad ? "  FAIL" : "");
    if (bad) g_failures++;
    free(g);
}

/* With bf16 activations: the reference continues from the values the device stored (rounded),
 * so that the next op's comparison measures that op, not the rounding before it. */
static void ref_takes_dev(pair *p) {
    if (p->kind != K_ACT || g_act == DT_DTYPE_F32) return;
    float *g = dev_download(p);
    REF(upload, p->c, g, p->n * 4);
    free(g);
}

/* the device buffer's raw bytes, for a rerun from the same start */
static void *raw_copy(const pair *p) {
    void *h = malloc(dev_bytes(p) + 1);
    CHECK(h);
    DEV(download, h, p->g, dev_bytes(p));
    dev_ok();
    return h;
}
static void raw_restore(const pair *p, const void *raw) { DEV(upload, p->g, raw, dev_bytes(p)); }

/* the device buffer's bytes are those of `first`, after running the op again */
static void check_bitwise_same(const char *what, const void *first, const pair *p) {
    void *h = raw_copy(p);
    int same = memcmp(h, first, dev_bytes(p)) == 0;
    printf("  %-44s %s\n", what, same ? "bit-identical on rerun" : "DIFFERS on rerun  FAIL");
    if (!same) g_failures++;
    free(h);
}

static void count_failure(int ok) {
    if (!ok) g_failures++;
}

/* ---- single ops: s[] holds the case's shape, tol its tolerance ---- */

/* The Llama family's ops may be NULL in a backend (ops.h), not in the CUDA one: 1 when `have`,
 * else says so (a failure on cuda) and returns 0. */
static int has_ops(const char *what, int have) {
    if (have) return 1;
    const int must = strcmp(g_dev->ops->name, "cuda") == 0;
    printf("  %s: %s has none%s\n", what, g_dev->ops->name, must ? "  FAIL (the CUDA backend must)" : ": skipped");
    count_failure(!must);
    return 0;
}

/* s: B T C V nopos runs packed (nopos 1: no learned positions, wpe and dwpe NULL, as the Llama
 * family's; runs 1: each row's tail is one pad token, as a classifier's batch (runs of thousands
 * once sorted), 2: every token the same; packed 1: rows packed from examples, each row's
 * learned position its position in its example) */
static void case_encoder(const int *s, double tol) {
    const int B = s[0], T = s[1], C = s[2], V = s[3], pos = !s[4], runs = s[5], packed = s[6], pad = V / 3;
    int *tok = rand_ints((size_t)B * T, 0, V);
    if (B * T >= 3) tok[0] = tok[1] = tok[2] = V - 1; /* repeated tokens meet in one dwte row */
    for (int b = 0; b < B && runs; b++) {
        const int len = runs == 2 ? 0 : 1 + (int)(urand() * T / 4); /* the row's text, then padding */
        for (int i = len; i < T; i++) tok[(size_t)b * T + i] = pad;
    }
    pair t = pair_ints(tok, (size_t)B * T), wte = pair_rand(K_F32, (size_t)V * C, -1, 1);
    pair wpe = pair_rand(K_F32, (size_t)T * C, -1, 1), out = pair_new(K_ACT, NULL, (size_t)B * T * C);
    int *hpos = packed ? rand_packed_pos(B, T) : NULL;
    pair pp = pair_ints(hpos ? hpos : tok, hpos ? (size_t)B * T : 1);
    const int *rp = hpos ? pp.c : NULL, *dp = hpos ? pp.g : NULL;
    printf("  encoder B %d T %d C %d V %d%s%s%s:\n", B, T, C, V, pos ? "" : ", no wpe",
           runs == 1 ? ", rows padded with one token" : runs == 2 ? ", one token" : "", packed ? ", packed rows" : "");
    if (g_dev->ops->reserve) { /* as a worker reserves for its model: the backend learns the vocabulary */
        dt_model_cfg mc = {.shape = {.vocab_size = V, .n_positions = T, .n_layer = 1, .n_head = 1, .n_embd = C},
                           .seq_len = T, .max_batch = B};
        dt_op_sizes sizes;
        dt_model_op_sizes(&mc, &sizes);
        CHECK_OK(DEV(reserve, &sizes));
    }
    REF(encoder_fwd, CA(out), t.c, rp, CF(wte), pos ? CF(wpe) : NULL, B, T, C);
    DEV(encoder_fwd, GA(out), t.g, dp, GF(wte), pos ? GF(wpe) : NULL, B, T, C);
    if (packed && pos) { /* the reference: row (b,t) holds wte[token] + wpe[its position in its example] */
        double worst = 0;
        for (size_t bt = 0; bt < (size_t)B * T; bt++)
            for (int c = 0; c < C; c++)
                worst = fmax(worst, fabs((double)CF(out)[bt * C + c] -
                                         ((double)CF(wte)[(size_t)tok[bt] * C + c] + CF(wpe)[(size_t)hpos[bt] * C + c])));
        printf("  %-44s max err %.3e%s\n", "cpu encoder_fwd packed: wpe[position]", worst, worst <= 1e-6 ? "" : "  FAIL");
        count_failure(worst <= 1e-6);
    }
    compare("encoder_fwd", &out, out.n, tol);
    pair dout = pair_rand(K_ACT, (size_t)B * T * C, -1, 1);
    /* wte/wpe now serve as gradients: non-zero, so accumulation is checked */
    void *wte0 = raw_copy(&wte), *wpe0 = raw_copy(&wpe);
    float *wpe_before = packed && pos ? malloc(wpe.n * sizeof(float)) : NULL; /* the reference's, before */
    if (wpe_before) memcpy(wpe_before, CF(wpe), wpe.n * sizeof(float));
    REF(encoder_bwd, CF(wte), pos ? CF(wpe) : NULL, CA(dout), t.c, rp, B, T, C);
    DEV(encoder_bwd, GF(wte), pos ? GF(wpe) : NULL, GA(dout), t.g, dp, B, T, C);
    if (wpe_before) { /* the reference: dwpe row p gained the dout rows at position p */
        for (size_t bt = 0; bt < (size_t)B * T; bt++)
            for (int c = 0; c < C; c++) wpe_before[(size_t)hpos[bt] * C + c] += CF(dout)[bt * C + c];
        double worst = 0;
        for (size_t i = 0; i < wpe.n; i++) worst = fmax(worst, fabs((double)wpe_before[i] - CF(wpe)[i]));
        printf("  %-44s max err %.3e%s\n", "cpu encoder_bwd packed: dwpe by position", worst, worst <= 1e-5 ? "" : "  FAIL");
        count_failure(worst <= 1e-5);
        free(wpe_before);
    }
    compare("encoder_bwd dwte (+=, repeated tokens)", &wte, wte.n, tol);
    compare(pos ? "encoder_bwd dwpe (+=)" : "encoder_bwd, dwpe NULL: wpe untouched", &wpe, wpe.n, pos ? tol : 0);
    void *first = raw_copy(&wte);
    raw_restore(&wte, wte0);
    raw_restore(&wpe, wpe0);
    DEV(encoder_bwd, GF(wte), pos ? GF(wpe) : NULL, GA(dout), t.g, dp, B, T, C);
    check_bitwise_same("encoder_bwd dwte", first, &wte);
    free(first);
    free(wte0);
    free(wpe0);
    free(tok);
    free(hpos);
    pair_free(&t); pair_free(&wte); pair_free(&wpe); pair_free(&out); pair_free(&dout); pair_free(&pp);
}

/* s: B T C V v0 Vs nopos N: tensor parallelism's share of the vocabulary, rows [v0, v0 + Vs) of V:
 * encoder_part_fwd/bwd (tokens outside the share: a zero row, skipped; nopos 1: wpe NULL), then
 * xent_part_stats and xent_part_bwd over N rows of the share's logits (targets inside, outside,
 * ignored), as a tensor-parallel worker calls them. */
static void case_parts(const int *s, double tol) {
    const int B = s[0], T = s[1], C = s[2], V = s[3], v0 = s[4], Vs = s[5], pos = !s[6], N = s[7];
    if (!has_ops("vocabulary shares", g_dev->ops->encoder_part_fwd && g_dev->ops->encoder_part_bwd &&
                                          g_dev->ops->xent_part_stats && g_dev->ops->xent_part_bwd))
        return;
    char what[96];
    printf("  share [%d, %d) of %d: B %d T %d C %d%s, %d rows:\n", v0, v0 + Vs, V, B, T, C, pos ? "" : ", no wpe", N);
    if (g_dev->ops->reserve) {
        dt_model_cfg mc = {.shape = {.vocab_size = V, .n_positions = T, .n_layer = 1, .n_head = 1, .n_embd = C},
                           .seq_len = T, .max_batch = B};
        dt_op_sizes sizes;
        dt_model_op_sizes(&mc, &sizes);
        CHECK_OK(DEV(reserve, &sizes));
    }
    int *tok = rand_ints((size_t)B * T, 0, V);
    if (B * T >= 3) tok[0] = tok[1] = tok[2] = v0 + Vs - 1; /* the share's last row, repeated */
    pair t = pair_ints(tok, (size_t)B * T), wte = pair_rand(K_F32, (size_t)Vs * C, -1, 1);
    pair wpe = pair_rand(K_F32, (size_t)T * C, -1, 1), out = pair_rand(K_ACT, (size_t)B * T * C, -1, 1);
    REF(encoder_part_fwd, CA(out), t.c, NULL, CF(wte), pos ? CF(wpe) : NULL, v0, Vs, B, T, C);
    DEV(encoder_part_fwd, GA(out), t.g, NULL, GF(wte), pos ? GF(wpe) : NULL, v0, Vs, B, T, C);
    compare("encoder_part_fwd (zero rows outside)", &out, out.n, tol);
    pair dout = pair_rand(K_ACT, (size_t)B * T * C, -1, 1);
    REF(encoder_part_bwd, CF(wte), pos ? CF(wpe) : NULL, CA(dout), t.c, NULL, v0, Vs, B, T, C);
    DEV(encoder_part_bwd, GF(wte), pos ? GF(wpe) : NULL, GA(dout), t.g, NULL, v0, Vs, B, T, C);
    compare("encoder_part_bwd dwte (+=, others skipped)", &wte, wte.n, tol);
    compare(pos ? "encoder_part_bwd dwpe (+=)" : "encoder_part_bwd, dwpe NULL", &wpe, wpe.n, pos ? tol : 0);

    const int ld = g_dev->ops->logits_stride(Vs);
    int *tg = rand_ints((size_t)N, 0, V);
    tg[0] = v0;                      /* the share's first column */
    if (N > 1) tg[1] = -1;           /* an ignored row */
    if (N > 2) tg[2] = v0 + Vs - 1;  /* its last */
    pair tt = pair_ints(tg, (size_t)N), logits = pair_rand(K_ACT, (size_t)N * ld, -6, 6);
    if (N > 3) { /* a tie for the maximum: the first column wins */
        CF(logits)[3 * (size_t)ld + 1] = CF(logits)[3 * (size_t)ld + Vs - 1] = 7.0f;
        dev_upload(&logits, CF(logits));
    }
    pair st = pair_new(K_F32, NULL, (size_t)N * 4);
    REF(xent_part_stats, CF(st), CA(logits), tt.c, v0, N, Vs, ld);
    DEV(xent_part_stats, GF(st), GA(logits), tt.g, v0, N, Vs, ld);
    snprintf(what, sizeof what, "xent_part_stats %dx%d (max, sum, target, column)", N, Vs);
    compare(what, &st, st.n, tol);
    float *lse = malloc((size_t)N * sizeof(float));
    for (int i = 0; i < N; i++) lse[i] = CF(st)[i * 4] + logf(CF(st)[i * 4 + 1]) + 0.5f; /* as if other shares added */
    pair l = pair_new(K_F32, lse, (size_t)N);
    REF(xent_part_bwd, CA(logits), CA(logits), CF(l), tt.c, v0, 0.25f, N, Vs, ld);
    DEV(xent_part_bwd, GA(logits), GA(logits), GF(l), tt.g, v0, 0.25f, N, Vs, ld);
    snprintf(what, sizeof what, "xent_part_bwd (in place, ignored row) %dx%d", N, Vs);
    compare(what, &logits, logits.n, tol);
    free(lse);
    free(tg);
    free(tok);
    pair_free(&t); pair_free(&wte); pair_free(&wpe); pair_free(&out); pair_free(&dout);
    pair_free(&tt); pair_free(&logits); pair_free(&st); pair_free(&l);
}

/* s: N C lo hi (inputs in [lo, hi): lo = 100, hi = 101 gives rows whose mean is 200x their spread) */
static void case_layernorm(const int *s, double tol) {
    const int N = s[0], C = s[1];
    const float lo = (float)s[2], hi = (float)s[3];
    pair inp = pair_rand(K_ACT, (size_t)N * C, lo, hi), w = pair_rand(K_F32, (size_t)C, 0.5f, 1.5f);
    pair b = pair_rand(K_F32, (size_t)C, -1, 1), out = pair_new(K_ACT, NULL, (size_t)N * C);
    pair mean = pair_new(K_F32, NULL, (size_t)N), rstd = pair_new(K_F32, NULL, (size_t)N);
    printf("  layernorm N %d C %d, inputs in [%g, %g):\n", N, C, lo, hi);
    REF(layernorm_fwd, CA(out), CF(mean), CF(rstd), CA(inp), CF(w), CF(b), N, C);
    DEV(layernorm_fwd, GA(out), GF(mean), GF(rstd), GA(inp), GF(w), GF(b), N, C);
    compare("layernorm_fwd out", &out, out.n, tol);
    compare("layernorm_fwd mean", &mean, mean.n, tol);
    compare("layernorm_fwd rstd", &rstd, rstd.n, tol);
    pair dout = pair_rand(K_ACT, (size_t)N * C, -1, 1), dinp = pair_rand(K_ACT, (size_t)N * C, -1, 1);
    pair dw = pair_rand(K_F32, (size_t)C, -1, 1), db = pair_rand(K_F32, (size_t)C, -1, 1);
    void *dw0 = raw_copy(&dw), *db0 = raw_copy(&db), *dinp0 = raw_copy(&dinp);
    REF(layernorm_bwd, CA(dinp), CF(dw), CF(db), CA(dout), CA(inp), CF(w), CF(mean), CF(rstd), N, C);
    DEV(layernorm_bwd, GA(dinp), GF(dw), GF(db), GA(dout), GA(inp), GF(w), GF(mean), GF(rstd), N, C);
    compare("layernorm_bwd dinp (+=)", &dinp, dinp.n, tol);
    compare("layernorm_bwd dw (+=)", &dw, dw.n, 3 * tol); /* sums over N rows in another order */
    compare("layernorm_bwd db (+=)", &db, db.n, 3 * tol);
    void *first = raw_copy(&dw);
    raw_restore(&dw, dw0);
    raw_restore(&db, db0);
    raw_restore(&dinp, dinp0);
    DEV(layernorm_bwd, GA(dinp), GF(dw), GF(db), GA(dout), GA(inp), GF(w), GF(mean), GF(rstd), N, C);
    check_bitwise_same("layernorm_bwd dw", first, &dw);
    /* frozen weights (model.lora): dw, db NULL, dinp alone */
    pair dinp2 = pair_rand(K_ACT, (size_t)N * C, -1, 1);
    REF(layernorm_bwd, CA(dinp2), NULL, NULL, CA(dout), CA(inp), CF(w), CF(mean), CF(rstd), N, C);
    DEV(layernorm_bwd, GA(dinp2), NULL, NULL, GA(dout), GA(inp), GF(w), GF(mean), GF(rstd), N, C);
    compare("layernorm_bwd dinp (+=), dw and db NULL", &dinp2, dinp2.n, tol);
    pair_free(&dinp2);
    free(first); free(dw0); free(db0); free(dinp0);
    pair_free(&inp); pair_free(&w); pair_free(&b); pair_free(&out); pair_free(&mean); pair_free(&rstd);
    pair_free(&dout); pair_free(&dinp); pair_free(&dw); pair_free(&db);
}

/* s: N C lo hi eps_exp (eps = 10^-eps_exp; inputs in [lo, hi)): RMSNorm (ops.h rmsnorm_fwd,
 * rmsnorm_bwd), rstd kept, dinp and dw accumulated, dw deterministic */
static void case_rmsnorm(const int *s, double tol) {
    const int N = s[0], C = s[1];
    const float lo = (float)s[2], hi = (float)s[3], eps = powf(10.0f, -(float)s[4]);
    if (!has_ops("rmsnorm", g_dev->ops->rmsnorm_fwd && g_dev->ops->rmsnorm_bwd)) return;
    pair inp = pair_rand(K_ACT, (size_t)N * C, lo, hi), w = pair_rand(K_F32, (size_t)C, 0.5f, 1.5f);
    pair out = pair_new(K_ACT, NULL, (size_t)N * C), rstd = pair_new(K_F32, NULL, (size_t)N);
    printf("  rmsnorm N %d C %d, inputs in [%g, %g), eps %g:\n", N, C, lo, hi, (double)eps);
    REF(rmsnorm_fwd, CA(out), CF(rstd), CA(inp), CF(w), N, C, eps);
    DEV(rmsnorm_fwd, GA(out), GF(rstd), GA(inp), GF(w), N, C, eps);
    compare("rmsnorm_fwd out", &out, out.n, tol);
    compare("rmsnorm_fwd rstd", &rstd, rstd.n, tol);
    pair dout = pair_rand(K_ACT, (size_t)N * C, -1, 1), dinp = pair_rand(K_ACT, (size_t)N * C, -1, 1);
    pair dw = pair_rand(K_F32, (size_t)C, -1, 1);
    void *dw0 = raw_copy(&dw), *dinp0 = raw_copy(&dinp);
    REF(rmsnorm_bwd, CA(dinp), CF(dw), CA(dout), CA(inp), CF(w), CF(rstd), N, C);
    DEV(rmsnorm_bwd, GA(dinp), GF(dw), GA(dout), GA(inp), GF(w), GF(rstd), N, C);
    compare("rmsnorm_bwd dinp (+=)", &dinp, dinp.n, tol);
    compare("rmsnorm_bwd dw (+=)", &dw, dw.n, 3 * tol); /* sums over N rows in another order */
    void *first = raw_copy(&dw);
    raw_restore(&dw, dw0);
    raw_restore(&dinp, dinp0);
    DEV(rmsnorm_bwd, GA(dinp), GF(dw), GA(dout), GA(inp), GF(w), GF(rstd), N, C);
    check_bitwise_same("rmsnorm_bwd dw", first, &dw);
    pair dinp2 = pair_rand(K_ACT, (size_t)N * C, -1, 1);
    REF(rmsnorm_bwd, CA(dinp2), NULL, CA(dout), CA(inp), CF(w), CF(rstd), N, C);
    DEV(rmsnorm_bwd, GA(dinp2), NULL, GA(dout), GA(inp), GF(w), GF(rstd), N, C);
    compare("rmsnorm_bwd dinp (+=), dw NULL (frozen)", &dinp2, dinp2.n, tol);
    pair_free(&dinp2);
    free(first); free(dw0); free(dinp0);
    pair_free(&inp); pair_free(&w); pair_free(&out); pair_free(&rstd); pair_free(&dout); pair_free(&dinp);
    pair_free(&dw);
}

/* s: M K N w_trans bias ldo. bias: 0 none, 1 a vector of its own, 2 one float into its buffer
 * (4-byte aligned, as biases inside the parameter buffer can be); the bias gradient likewise.
 * ldo: out's and dout's row stride (0: N); the columns past N hold random values that the
 * product must neither read nor write (compared with the rest).
 * Tiny shapes multiply pair_grid values, exact in bf16: over a few terms one bf16 rounding is
 * not averaged out, and a bias or gradient of similar size could cancel most of the result. */
static void case_matmul(const int *s, double tol) {
    const int M = s[0], K = s[1], N = s[2], w_trans = s[3], bias = s[4], ldo = s[5] ? s[5] : N;
    char what[112];
    const int off = bias == 2, tiny = M * K * N < 1000;
    pair inp = tiny ? pair_grid(K_ACT, (size_t)M * K) : pair_rand(K_ACT, (size_t)M * K, -1, 1);
    pair w = tiny ? pair_grid(K_F32, (size_t)K * N) : pair_rand(K_F32, (size_t)K * N, -1, 1);
    /* tiny: the bias on the grid too, exact in bf16 (a bf16 bias copy rounds it, the CPU's does
     * not: where the product cancels most of the bias, that was all of the relative error) */
    pair b = tiny ? pair_grid(K_F32, (size_t)N + 1) : pair_rand(K_F32, (size_t)N + 1, -1, 1);
    pair out = ldo > N ? pair_rand(K_ACT, (size_t)M * ldo, -1, 1) : pair_new(K_ACT, NULL, (size_t)M * N);
    REF(matmul_fwd, CA(out), CA(inp), CF(w), bias ? CF(b) + off : NULL, M, K, N, ldo, w_trans);
    DEV(matmul_fwd, GA(out), GA(inp), GF(w), bias ? GF(b) + off : NULL, M, K, N, ldo, w_trans);
    snprintf(what, sizeof what, "matmul_fwd %dx%dx%d w_trans %d%s, rows %d apart", M, K, N, w_trans,
             bias == 2 ? " bias (4-byte aligned)" : bias ? " bias" : "", ldo);
    compare(what, &out, out.n, tol);
    pair dout = tiny ? pair_grid(K_ACT, (size_t)M * ldo) : pair_rand(K_ACT, (size_t)M * ldo, -1, 1);
    pair dinp = pair_rand(K_ACT, (size_t)M * K, -1, 1), dw = pair_rand(K_F32, (size_t)K * N, -1, 1);
    pair db = pair_rand(K_F32, (size_t)N + 1, -1, 1);
    REF(matmul_bwd, CA(dinp), CF(dw), bias ? CF(db) + off : NULL, CA(dout), CA(inp), CF(w), M, K, N, ldo, w_trans);
    DEV(matmul_bwd, GA(dinp), GF(dw), bias ? GF(db) + off : NULL, GA(dout), GA(inp), GF(w), M, K, N, ldo, w_trans);
    snprintf(what, sizeof what, "matmul_bwd dinp %dx%dx%d w_trans %d", M, K, N, w_trans);
    compare(what, &dinp, dinp.n, tol);
    snprintf(what, sizeof what, "matmul_bwd dw (+=) %dx%dx%d w_trans %d", M, K, N, w_trans);
    compare(what, &dw, dw.n, tol);
    if (bias) {
        snprintf(what, sizeof what, "matmul_bwd dbias (+=) %dx%d", M, N);
        compare(what, &db, db.n, 3e-5); /* a column sum, not a product: fp32 at any precision */
    }
    /* what ops.h lets a caller skip: dinp (the first layer's input), dw (frozen weights); the
     * paths do not depend on the size, so not for the largest shape */
    if ((size_t)M * K * N < ((size_t)1 << 24)) {
        REF(matmul_bwd, NULL, CF(dw), NULL, CA(dout), CA(inp), CF(w), M, K, N, ldo, w_trans);
        DEV(matmul_bwd, NULL, GF(dw), NULL, GA(dout), GA(inp), GF(w), M, K, N, ldo, w_trans);
        REF(matmul_bwd, CA(dinp), NULL, NULL, CA(dout), CA(inp), CF(w), M, K, N, ldo, w_trans);
        DEV(matmul_bwd, GA(dinp), NULL, NULL, GA(dout), GA(inp), GF(w), M, K, N, ldo, w_trans);
        snprintf(what, sizeof what, "matmul_bwd dw (+=), dinp NULL %dx%dx%d", M, K, N);
        compare(what, &dw, dw.n, tol);
        snprintf(what, sizeof what, "matmul_bwd dinp, dw NULL %dx%dx%d", M, K, N);
        compare(what, &dinp, dinp.n, tol);
    }
    pair_free(&inp); pair_free(&w); pair_free(&b); pair_free(&out);
    pair_free(&dout); pair_free(&dinp); pair_free(&dw); pair_free(&db);
}

/* A frozen weight of n elements kept in bf16 (model.lora.base_dtype), on both backends: *c, *g
 * (free with REF/DEV free); *host its values as floats. */
static void bf16_weight(size_t n, void **c, void **g, float **host) {
    float *h = rand_host(n, -1, 1);
    uint16_t *b = malloc(n * sizeof *b + 1);
    CHECK(b);
    for (size_t i = 0; i < n; i++) h[i] = from_bf16(b[i] = to_bf16(h[i]));
    CHECK(REF(alloc, n * 2, "test", c) == DT_OK);
    CHECK_OK(DEV(alloc, n * 2, "test", g));
    REF(upload, *c, b, n * 2);
    DEV(upload, *g, b, n * 2);
    free(b);
    *host = h;
}

/* The ops of a bf16 base need bf16 products on a device backend (ops.h): 1 when this run has
 * them, else says the case is skipped. */
static int base16_runs(const char *what) {
    if (!has_ops(what, g_dev->ops->matmul16_fwd && g_dev->ops->matmul16_bwd && g_dev->ops->encoder16_fwd)) return 0;
    if (g_dev->ops->bf16(g_dev->ctx)) return 1;
    printf("  %s: a bf16 base runs with bf16 products only: skipped at fp32\n", what);
    return 0;
}

/* s: M K N w_trans bias ldo. The products of a frozen bf16 weight (ops.h matmul16_fwd,
 * matmul16_bwd) against the CPU's (its fp32 product of the widened weight, in pieces of at most
 * base16 elements: s[6], 0 for the whole weight); the CPU's in one piece is the fp32 product of
 * the same values, bit for bit. */
static void case_matmul16(const int *s, double tol) {
    const int M = s[0], K = s[1], N = s[2], w_trans = s[3], bias = s[4], ldo = s[5] ? s[5] : N;
    if (!base16_runs("matmul16")) return;
    char what[112];
    dt_op_sizes sz = {.base16 = s[6] ? (size_t)s[6] : (size_t)K * N};
    CHECK_OK(REF(reserve, &sz));
    void *wc, *wg;
    float *wh;
    bf16_weight((size_t)K * N, &wc, &wg, &wh);
    pair w32 = pair_new(K_F32, wh, (size_t)K * N); /* the same values as floats */
    pair inp = pair_rand(K_ACT, (size_t)M * K, -1, 1), b = pair_rand(K_F32, (size_t)N, -1, 1);
    pair out = ldo > N ? pair_rand(K_ACT, (size_t)M * ldo, -1, 1) : pair_new(K_ACT, NULL, (size_t)M * N);
    REF(matmul16_fwd, CA(out), CA(inp), wc, bias ? CF(b) : NULL, M, K, N, ldo, w_trans);
    DEV(matmul16_fwd, GA(out), GA(inp), wg, bias ? GF(b) : NULL, M, K, N, ldo, w_trans);
    snprintf(what, sizeof what, "matmul16_fwd %dx%dx%d w_trans %d%s, rows %d apart", M, K, N, w_trans,
             bias ? " bias" : "", ldo);
    compare(what, &out, out.n, tol);
    float *ref = malloc(out.n * sizeof(float) + 1);
    CHECK(ref);
    REF(matmul_fwd, (dt_act *)ref, CA(inp), CF(w32), bias ? CF(b) : NULL, M, K, N, ldo, w_trans);
    if (ldo > N) /* the columns past N as matmul16_fwd left them */
        for (int i = 0; i < M; i++) memcpy(ref + (size_t)i * ldo + N, CF(out) + (size_t)i * ldo + N, (size_t)(ldo - N) * 4);
    if (!s[6]) {
        const int same = memcmp(ref, out.c, out.n * sizeof(float)) == 0;
        printf("  %-44s %s\n", "cpu matmul16_fwd, one piece", same ? "= matmul_fwd of the widened weight, bit for bit"
                                                                     : "DIFFERS from matmul_fwd  FAIL");
        count_failure(same);
    }
    pair dout = pair_rand(K_ACT, (size_t)M * ldo, -1, 1), dinp = pair_rand(K_ACT, (size_t)M * K, -1, 1);
    REF(matmul16_bwd, CA(dinp), CA(dout), wc, M, K, N, ldo, w_trans);
    DEV(matmul16_bwd, GA(dinp), GA(dout), wg, M, K, N, ldo, w_trans);
    snprintf(what, sizeof what, "matmul16_bwd dinp %dx%dx%d w_trans %d%s", M, K, N, w_trans, s[6] ? ", in pieces" : "");
    compare(what, &dinp, dinp.n, tol);
    free(ref);
    free(wh);
    REF(free, wc);
    DEV(free, wg);
    pair_free(&w32); pair_free(&inp); pair_free(&b); pair_free(&out); pair_free(&dout); pair_free(&dinp);
}

/* s: B T C V nopos packed v0 Vs: encoder16_fwd (bf16 tables) against the CPU's; Vs > 0: a
 * tensor-parallel share, the table's rows [v0, v0 + Vs) of V (tokens outside it: zero rows),
 * where the CPU's must also give the bits of encoder_part_fwd over the widened table */
static void case_encoder16(const int *s, double tol) {
    const int B = s[0], T = s[1], C = s[2], V = s[3], pos = !s[4], packed = s[5], v0 = s[6], Vs = s[7] ? s[7] : V;
    if (!base16_runs("encoder16")) return;
    int *tok = rand_ints((size_t)B * T, 0, V);
    void *ec, *eg, *pc = NULL, *pg = NULL;
    float *eh, *ph = NULL;
    bf16_weight((size_t)Vs * C, &ec, &eg, &eh);
    if (pos) bf16_weight((size_t)T * C, &pc, &pg, &ph);
    int *hpos = packed ? rand_packed_pos(B, T) : NULL;
    pair t = pair_ints(tok, (size_t)B * T), pp = pair_ints(hpos ? hpos : tok, hpos ? (size_t)B * T : 1);
    pair out = pair_new(K_ACT, NULL, (size_t)B * T * C);
    const int lo = s[7] ? v0 : 0, n = s[7] ? Vs : INT_MAX;
    REF(encoder16_fwd, CA(out), t.c, hpos ? pp.c : NULL, ec, pc, lo, n, B, T, C);
    DEV(encoder16_fwd, GA(out), t.g, hpos ? pp.g : NULL, eg, pg, lo, n, B, T, C);
    char what[112];
    snprintf(what, sizeof what, "encoder16_fwd B %d T %d C %d V %d%s%s%s", B, T, C, V, pos ? "" : ", no wpe",
             packed ? ", packed rows" : "", s[7] ? ", a share of the rows" : "");
    compare(what, &out, out.n, tol);
    if (s[7]) { /* the CPU's share against its fp32 encoder_part_fwd over the same (widened) values */
        float *w32, *p32 = NULL, *want = malloc((size_t)B * T * C * sizeof(float));
        CHECK(want && REF(alloc, (size_t)Vs * C * 4, "test", (void **)&w32) == DT_OK);
        REF(upload, w32, eh, (size_t)Vs * C * 4);
        if (pos) {
            CHECK(REF(alloc, (size_t)T * C * 4, "test", (void **)&p32) == DT_OK);
            REF(upload, p32, ph, (size_t)T * C * 4);
        }
        REF(encoder_part_fwd, (dt_act *)want, t.c, hpos ? pp.c : NULL, w32, p32, v0, Vs, B, T, C);
        CHECK(memcmp(want, CA(out), (size_t)B * T * C * sizeof(float)) == 0);
        printf("  encoder16_fwd, a share of the rows: the cpu's bits are its encoder_part_fwd's\n");
        free(want);
        REF(free, w32);
        if (p32) REF(free, p32);
    }
    free(tok); free(hpos); free(eh); free(ph);
    REF(free, ec); DEV(free, eg);
    if (pos) { REF(free, pc); DEV(free, pg); }
    pair_free(&t); pair_free(&pp); pair_free(&out);
}

/* lora_bwd's three gradients (+=) compared, `how` naming the call; s: case_lora's shape */
static void lora_grads(const char *how, pair *dinp, pair *dA, pair *dB, const int *s, double tol) {
    const pair *p[3] = {dinp, dA, dB};
    const char *name[3] = {"dinp", "dA", "dB"};
    char what[128];
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "%s %s (+=) %dx%dx%d rank %d", how, name[i], s[0], s[1], s[2], s[3]);
        compare(what, p[i], p[i]->n, tol);
    }
}

/* s: M K N r ldo col0. A LoRA adapter (ops.h lora_fwd, lora_bwd) on columns [col0, col0 + N)
 * of an output whose rows are ldo apart (Llama's k of [q | k | v]): out += s (inp A^T) B^T, the
 * other columns untouched; backward dB +=, dA +=, dinp += (and each skipped when NULL). */
static void case_lora(const int *s, double tol) {
    const int M = s[0], K = s[1], N = s[2], r = s[3], ldo = s[4] ? s[4] : N, col0 = s[5];
    const float sc = 2.5f;
    char what[128];
    if (!has_ops("lora", g_dev->ops->lora_fwd && g_dev->ops->lora_bwd)) return;
    pair inp = pair_rand(K_ACT, (size_t)M * K, -1, 1), A = pair_rand(K_F32, (size_t)r * K, -0.5f, 0.5f);
    pair B = pair_rand(K_F32, (size_t)N * r, -0.5f, 0.5f), out = pair_rand(K_ACT, (size_t)M * ldo, -1, 1);
    pair h = pair_new(K_F32, NULL, (size_t)M * r), dh = pair_new(K_F32, NULL, (size_t)M * r);
    /* column col0 of row 0: the CPU's copy is fp32, the device's of its activation type */
#define COL(p, side) ((dt_act *)((char *)(side) + (size_t)col0 * ((side) == CA(p) ? 4 : dt_dtype_size(g_act))))
    REF(lora_fwd, COL(out, CA(out)), CF(h), CA(inp), CF(A), CF(B), M, K, N, r, ldo, sc);
    DEV(lora_fwd, COL(out, GA(out)), GF(h), GA(inp), GF(A), GF(B), M, K, N, r, ldo, sc);
    snprintf(what, sizeof what, "lora_fwd (+=) %dx%dx%d rank %d, columns %d.. of rows %d apart", M, K, N, r, col0, ldo);
    compare(what, &out, out.n, tol);
    pair dout = pair_rand(K_ACT, (size_t)M * ldo, -1, 1), dinp = pair_rand(K_ACT, (size_t)M * K, -1, 1);
    pair dA = pair_rand(K_F32, (size_t)r * K, -1, 1), dB = pair_rand(K_F32, (size_t)N * r, -1, 1);
    REF(lora_bwd, CA(dinp), CF(dA), CF(dB), CF(h), CF(dh), COL(dout, CA(dout)), CA(inp), CF(A), CF(B), M, K, N, r, ldo, sc);
    DEV(lora_bwd, GA(dinp), GF(dA), GF(dB), GF(h), GF(dh), COL(dout, GA(dout)), GA(inp), GF(A), GF(B), M, K, N, r, ldo, sc);
    lora_grads("lora_bwd", &dinp, &dA, &dB, s, tol);
    /* the first layer's input gradient is not asked for */
    REF(lora_bwd, NULL, CF(dA), CF(dB), CF(h), CF(dh), COL(dout, CA(dout)), CA(inp), CF(A), CF(B), M, K, N, r, ldo, sc);
    DEV(lora_bwd, NULL, GF(dA), GF(dB), GF(h), GF(dh), COL(dout, GA(dout)), GA(inp), GF(A), GF(B), M, K, N, r, ldo, sc);
    snprintf(what, sizeof what, "lora_bwd dA (+=), dinp NULL %dx%dx%d rank %d", M, K, N, r);
    compare(what, &dA, dA.n, tol);
    /* tensor parallelism's two calls on the device (dh, dB and dinp from dout; then dA from the dh
     * given, dout NULL) against the reference's one */
    REF(lora_bwd, CA(dinp), CF(dA), CF(dB), CF(h), CF(dh), COL(dout, CA(dout)), CA(inp), CF(A), CF(B), M, K, N, r, ldo, sc);
    DEV(lora_bwd, GA(dinp), NULL, GF(dB), GF(h), GF(dh), COL(dout, GA(dout)), GA(inp), GF(A), GF(B), M, K, N, r, ldo, sc);
    DEV(lora_bwd, NULL, GF(dA), NULL, GF(h), GF(dh), NULL, GA(inp), GF(A), GF(B), M, K, N, r, ldo, sc);
    lora_grads("lora_bwd in two calls (dh given)", &dinp, &dA, &dB, s, tol);
#undef COL
    pair_free(&inp); pair_free(&A); pair_free(&B); pair_free(&out); pair_free(&h); pair_free(&dh);
    pair_free(&dout); pair_free(&dinp); pair_free(&dA); pair_free(&dB);
}

/* A product that a bias all but cancels, on values exact in bf16: x = w = 1 + 7/128, b = -1.
 * x w = 1 + 14/128 + 49/16384 needs 14 bits; rounded once with the bias, the result 0.11237 is
 * within bf16's half unit; a product rounded to bf16 before the bias is added loses the 49/16384
 * (0.109375, 2.7% off). So with bf16 outputs every path (the bias epilogue, the bias kernel
 * where it has none) must add the bias before rounding. The bias lies outside the weights, as
 * it may (ops.h): on CUDA that is the bias kernel's path. */
static void case_matmul_cancel(const int *s, double tol) {
    (void)s;
    const float one = 1.0546875f, minus = -1.0f;
    pair inp = pair_new(K_ACT, &one, 1), w = pair_new(K_F32, &one, 1), b = pair_new(K_F32, &minus, 1);
    pair out = pair_new(K_ACT, NULL, 1);
    REF(matmul_fwd, CA(out), CA(inp), CF(w), CF(b), 1, 1, 1, 1, 0);
    DEV(matmul_fwd, GA(out), GA(inp), GF(w), GF(b), 1, 1, 1, 1, 0);
    compare("matmul_fwd 1x1x1, a bias that cancels", &out, 1, tol);
    pair_free(&inp); pair_free(&w); pair_free(&b); pair_free(&out);
}

/* s: M K N bias. The MLP's product with its GELU (ops.h matmul_gelu_fwd, matmul_gelu_bwd; CUDA:
 * cuBLASLt's GELU and DGELU epilogues where it has them, which needs each aux ld, N forward and
 * K backward, divisible by 8; else the product and our GELU kernels) against the CPU's
 * matmul then gelu, and gelu_bwd then matmul_bwd. */
static void case_matmul_gelu(const int *s, double tol) {
    const int M = s[0], K = s[1], N = s[2], bias = s[3];
    char what[112];
    if (!g_dev->ops->matmul_gelu_fwd || !g_dev->ops->matmul_gelu_bwd) {
        printf("  matmul_gelu: %s has no fused product and GELU\n", g_dev->ops->name);
        return;
    }
    pair inp = pair_rand(K_ACT, (size_t)M * K, -1, 1), w = pair_rand(K_F32, (size_t)K * N, -1, 1);
    pair b = pair_rand(K_F32, (size_t)N, -1, 1);
    pair pre = pair_new(K_ACT, NULL, (size_t)M * N), out = pair_new(K_ACT, NULL, (size_t)M * N);
    REF(matmul_fwd, CA(pre), CA(inp), CF(w), bias ? CF(b) : NULL, M, K, N, N, 0);
    REF(gelu_fwd, CA(out), CA(pre), (size_t)M * N);
    DEV(matmul_gelu_fwd, GA(out), GA(pre), GA(inp), GF(w), bias ? GF(b) : NULL, M, K, N);
    snprintf(what, sizeof what, "matmul_gelu_fwd pre %dx%dx%d%s", M, K, N, bias ? " bias" : "");
    compare(what, &pre, pre.n, tol);
    snprintf(what, sizeof what, "matmul_gelu_fwd out %dx%dx%d%s", M, K, N, bias ? " bias" : "");
    compare(what, &out, out.n, tol);
    /* backward of out(M,K) = gelu(pre) @ W2(K,N): here inp is gelu's output, pre its input */
    pair x = pair_rand(K_ACT, (size_t)M * K, -3, 3), gx = pair_new(K_ACT, NULL, (size_t)M * K);
    pair dout = pair_rand(K_ACT, (size_t)M * N, -1, 1), dinp = pair_new(K_ACT, NULL, (size_t)M * K);
    pair tmp = pair_new(K_ACT, NULL, (size_t)M * K), dw = pair_rand(K_F32, (size_t)K * N, -1, 1);
    pair db = pair_rand(K_F32, (size_t)N, -1, 1);
    REF(gelu_fwd, CA(gx), CA(x), (size_t)M * K);
    DEV(gelu_fwd, GA(gx), GA(x), (size_t)M * K);
    ref_takes_dev(&gx); /* both from the device's gelu output */
    REF(matmul_bwd, CA(tmp), CF(dw), bias ? CF(db) : NULL, CA(dout), CA(gx), CF(w), M, K, N, N, 0);
    REF(gelu_bwd, CA(dinp), CA(x), CA(tmp), (size_t)M * K);
    DEV(matmul_gelu_bwd, GA(dinp), GA(tmp), GF(dw), bias ? GF(db) : NULL, GA(dout), GA(gx), GF(w), GA(x), M, K, N);
    snprintf(what, sizeof what, "matmul_gelu_bwd dinp %dx%dx%d", M, K, N);
    compare(what, &dinp, dinp.n, tol);
    snprintf(what, sizeof what, "matmul_gelu_bwd dw (+=) %dx%dx%d", M, K, N);
    compare(what, &dw, dw.n, tol);
    if (bias) {
        snprintf(what, sizeof what, "matmul_gelu_bwd dbias (+=) %dx%d", M, N);
        compare(what, &db, db.n, 3e-5);
    }
    pair_free(&inp); pair_free(&w); pair_free(&b); pair_free(&pre); pair_free(&out); pair_free(&x); pair_free(&gx);
    pair_free(&dout); pair_free(&dinp); pair_free(&tmp); pair_free(&dw); pair_free(&db);
}

/* The reference's packed attention (out, of qkv at shape as, positions hpos) against itself
 * unpacked: every example alone, one sequence of its own rows from position 0. */
static void packed_attention_ref(const dt_att_shape *as, const int *hpos, const pair *qkv, const pair *out) {
    const size_t W = (size_t)(as->NH + 2 * as->NKV) * as->hs, HQ = (size_t)as->NH * as->hs;
    double worst = 0;
    for (int b = 0; b < as->B; b++)
        for (int t0 = 0; t0 < as->T;) {
            int n = 1;
            while (t0 + n < as->T && hpos[(size_t)b * as->T + t0 + n] != 0) n++;
            const dt_att_shape one = {1, n, as->NH, as->NKV, as->hs, NULL};
            const size_t r0 = (size_t)b * as->T + t0;
            float *o = malloc((size_t)n * HQ * sizeof(float)), *a = malloc((size_t)as->NH * n * n * sizeof(float));
            CHECK(o && a);
            REF(attention_fwd, (dt_act *)o, a, (const dt_act *)(CF(*qkv) + r0 * W), &one);
            for (size_t i = 0; i < (size_t)n * HQ; i++) worst = fmax(worst, fabs((double)o[i] - CF(*out)[r0 * HQ + i]));
            free(o);
            free(a);
            t0 += n;
        }
    printf("  %-44s max err %.3e%s\n", "cpu packed = each example alone", worst, worst <= 1e-6 ? "" : "  FAIL");
    count_failure(worst <= 1e-6);
}

/* s: B T NH NKV hs packed: attention's shape (dt_att_shape; NKV < NH: grouped-query; packed 1:
 * rows packed from examples, ops.h dt_att_shape pos). Each backend's
 * att and datt are sized by its attention_bytes; the probabilities are compared where the device
 * keeps them (a fused attention, cuDNN's, keeps statistics). */
static void case_attention(const int *s, double tol) {
    dt_att_shape as = {s[0], s[1], s[2], s[3], s[4], NULL}; /* the reference's; the device's: das */
    const int B = as.B, T = as.T, NH = as.NH, packed = s[5];
    int *hpos = packed ? rand_packed_pos(B, T) : NULL;
    pair pp = pair_ints(hpos ? hpos : &as.B, hpos ? (size_t)B * T : 1);
    dt_att_shape das = as;
    if (hpos) as.pos = pp.c, das.pos = pp.g;
    const size_t BT = (size_t)B * T, P = (size_t)B * NH * T * T, W = (size_t)(as.NH + 2 * as.NKV) * as.hs;
    const size_t HQ = (size_t)as.NH * as.hs;
    size_t ra, rd, da, dd;
    CHECK(g_ref->ops->attention_bytes(g_ref->ctx, &as, 0, &ra, &rd) == 1 && ra == P * 4);
    const int probs = g_dev->ops->attention_bytes(g_dev->ctx, &das, g_dev->ops->bf16(g_dev->ctx), &da, &dd);
    CHECK(!probs || (da == P * 4 && dd == P * 4)); /* probabilities are floats */
    /* on a GPU whose cuDNN must plan it (gpu-check.sh sets DTRAIN_REQUIRE_FAST_PATH=1 on sm_90): a
     * head size cuDNN supports (multiples of 8 up to 128) takes the fused path in bf16, packed
     * rows too (their mask per example) */
    const char *req = getenv("DTRAIN_REQUIRE_FAST_PATH");
    if (req && strcmp(req, "1") == 0 && probs && g_dev->ops->bf16(g_dev->ctx) && as.T > 1 && as.hs % 8 == 0 &&
        as.hs <= 128) {
        const dt_status st = g_dev->ops->check(g_dev->ctx);
        printf("  attention B %d T %d NH %d NKV %d hs %d: not fused (DTRAIN_REQUIRE_FAST_PATH=1): %s  FAIL\n", B, T, NH,
               as.NKV, as.hs, st != DT_OK ? dt_error_msg() : "no reason given");
        count_failure(0);
        exit(1); /* the backend's first failure stays: the later cases could only repeat it */
    }
    pair qkv = pair_rand(K_ACT, BT * W, -1, 1), out = pair_new(K_ACT, NULL, BT * HQ);
    pair att = pair_new(K_F32, NULL, P); /* the reference's probabilities (floats); the device's when it keeps them */
    void *dev_att = NULL, *dev_datt = NULL;
    if (!probs) CHECK(DEV(alloc, da, "test", &dev_att) == DT_OK && DEV(alloc, dd, "test", &dev_datt) == DT_OK);
    printf("  attention B %d T %d NH %d NKV %d hs %d%s%s:\n", B, T, NH, as.NKV, as.hs, packed ? ", packed rows" : "",
           probs ? "" : " (fused, statistics kept)");
    REF(attention_fwd, CA(out), CA(att), CA(qkv), &as);
    DEV(attention_fwd, GA(out), probs ? att.g : dev_att, GA(qkv), &das);
    compare("attention_fwd out", &out, out.n, tol);
    if (probs) {
        compare("attention_fwd probabilities (0 above diag)", &att, att.n, tol);
        /* the future (and, packed, the examples before the row's) really is masked: exact zeros */
        float *a = dev_download(&att);
        size_t nonzero = 0;
        for (size_t bh = 0; bh < (size_t)B * NH; bh++)
            for (int t = 0; t < T; t++) {
                const int lo = hpos ? t - hpos[bh / NH * T + t] : 0;
                for (int u = 0; u < T; u++) nonzero += (u < lo || u > t) && a[(bh * T + t) * T + u] != 0.0f;
            }
        printf("  %-44s %zu non-zero%s\n", packed ? "attention_fwd mask (causal, within examples)" : "attention_fwd causal mask",
               nonzero, nonzero ? "  FAIL" : "");
        count_failure(nonzero == 0);
        free(a);
    }
    if (hpos) packed_attention_ref(&as, hpos, &qkv, &out);
    pair dout = pair_rand(K_ACT, BT * HQ, -1, 1), dqkv = pair_new(K_ACT, NULL, BT * W), datt = pair_new(K_F32, NULL, P);
    REF(attention_bwd, CA(dqkv), CA(datt), CA(dout), CA(qkv), CA(out), CA(att), &as);
    DEV(attention_bwd, GA(dqkv), probs ? datt.g : dev_datt, GA(dout), GA(qkv), GA(out), probs ? att.g : dev_att, &das);
    compare(as.NKV < NH ? "attention_bwd dqkv (dk, dv: groups summed)" : "attention_bwd dqkv", &dqkv, dqkv.n, tol * 2);
    if (!probs) { /* cuDNN's backward is asked to be deterministic: the same bits again */
        void *first = raw_copy(&dqkv);
        DEV(attention_bwd, GA(dqkv), dev_datt, GA(dout), GA(qkv), GA(out), dev_att, &das);
        check_bitwise_same("attention_bwd dqkv (fused)", first, &dqkv);
        free(first);
    }
    DEV(free, dev_att);
    DEV(free, dev_datt);
    free(hpos);
    pair_free(&qkv); pair_free(&out); pair_free(&att); pair_free(&dout); pair_free(&dqkv); pair_free(&datt);
    pair_free(&pp);
}

/* s: T NH NKV hs split. One sequence of T rows through the key/value cache (rows NKV*hs wide)
 * in three calls (rows 0..split-1, row split, the rest), each against the reference; on the
 * reference, the rows together equal attention_fwd's output over the whole sequence. */
static void case_attention_cached(const int *s, double tol) {
    const int T = s[0], NH = s[1], NKV = s[2], hs = s[3], split = s[4];
    const size_t W = (size_t)(NH + 2 * NKV) * hs, HQ = (size_t)NH * hs, KV = (size_t)NKV * hs;
    pair qkv = pair_rand(K_ACT, (size_t)T * W, -1, 1), out = pair_new(K_ACT, NULL, (size_t)T * HQ);
    pair kc = pair_new(K_ACT, NULL, (size_t)T * KV), vc = pair_new(K_ACT, NULL, (size_t)T * KV);
    pair scr = pair_new(K_F32, NULL, (size_t)T * NH * T);
    printf("  attention_cached T %d NH %d NKV %d hs %d split at %d:\n", T, NH, NKV, hs, split);
    const int from[3] = {0, split, split + 1}, to[3] = {split, split + 1, T};
    const size_t ab = dt_dtype_size(g_act); /* the device's activation bytes */
    for (int c = 0; c < 3; c++) {
        const dt_att_shape as = {1, to[c] - from[c], NH, NKV, hs, NULL};
        if (as.T <= 0) continue;
        const size_t q = (size_t)from[c] * W, o = (size_t)from[c] * HQ;
        REF(attention_cached, (dt_act *)(CF(out) + o), CA(kc), CA(vc), CF(scr), (dt_act *)(CF(qkv) + q), from[c], &as);
        DEV(attention_cached, (dt_act *)((char *)out.g + o * ab), GA(kc), GA(vc), GF(scr),
            (dt_act *)((char *)qkv.g + q * ab), from[c], &as);
    }
    compare("attention_cached out (3 calls)", &out, out.n, tol);
    compare("attention_cached key cache", &kc, kc.n, tol);
    compare("attention_cached value cache", &vc, vc.n, tol);
    const dt_att_shape whole = {1, T, NH, NKV, hs, NULL};
    pair full = pair_new(K_ACT, NULL, (size_t)T * HQ), att = pair_new(K_ACT, NULL, (size_t)NH * T * T);
    REF(attention_fwd, CA(full), CA(att), CA(qkv), &whole);
    double num = 0, den = 0;
    for (size_t i = 0; i < full.n; i++) {
        double d = (double)CF(out)[i] - CF(full)[i];
        num += d * d;
        den += (double)CF(full)[i] * CF(full)[i];
    }
    const double rel = sqrt(num) / fmax(sqrt(den), 1e-30);
    printf("  %-44s rel L2 %.3e (tol 1e-6)%s\n", "cpu attention_cached = attention_fwd", rel, rel <= 1e-6 ? "" : "  FAIL");
    count_failure(rel <= 1e-6);
    pair_free(&qkv); pair_free(&out); pair_free(&kc); pair_free(&vc); pair_free(&scr); pair_free(&full); pair_free(&att);
}

/* s: B T NH NKV hs pos0: rotary positions on the q and k heads of qkv (ops.h rope_fwd; v must
 * stay as it was), rows at positions pos0.., then rope_bwd on a gradient; inv_freq as the model
 * makes them (theta 10000, and 500000 as Llama 3's: large angles at high positions). */
static void case_rope(const int *s, double tol) {
    dt_att_shape as = {s[0], s[1], s[2], s[3], s[4], NULL};
    const int pos0 = s[5], half = as.hs / 2, packed = s[6];
    int *hpos = packed ? rand_packed_pos(as.B, as.T) : NULL;
    pair pp = pair_ints(hpos ? hpos : &as.B, hpos ? (size_t)as.B * as.T : 1);
    dt_att_shape das = as;
    if (hpos) as.pos = pp.c, das.pos = pp.g;
    const size_t n = (size_t)as.B * as.T * (as.NH + 2 * as.NKV) * as.hs;
    if (!has_ops("rope", g_dev->ops->rope_fwd && g_dev->ops->rope_bwd)) return;
    printf("  rope B %d T %d NH %d NKV %d hs %d %s %d:\n", as.B, as.T, as.NH, as.NKV, as.hs,
           packed ? "packed rows, pos0" : "from position", pos0);
    for (int k = 0; k < 2; k++) {
        const double theta = k ? 500000.0 : 10000.0;
        float *f = malloc(((size_t)half + 1) * sizeof *f);
        CHECK(f);
        for (int i = 0; i < half; i++) f[i] = (float)(1.0 / pow(theta, 2.0 * i / as.hs));
        pair inv = pair_new(K_F32, f, (size_t)half), x = pair_rand(K_ACT, n, -1, 1), d = pair_rand(K_ACT, n, -1, 1);
        REF(rope_fwd, CA(x), CF(inv), pos0, &as);
        DEV(rope_fwd, GA(x), GF(inv), pos0, &das);
        compare(k ? "rope_fwd (in place, theta 5e5)" : "rope_fwd (in place, theta 1e4)", &x, n, tol);
        if (hpos && k == 0) { /* the reference: each row as a one-row sequence at its position */
            pair y = pair_rand(K_ACT, n, -1, 1);
            const size_t W = (size_t)(as.NH + 2 * as.NKV) * as.hs;
            float *y0 = malloc(n * sizeof(float));
            CHECK(y0);
            memcpy(y0, CF(y), n * sizeof(float));
            REF(rope_fwd, CA(y), CF(inv), 0, &as);
            const dt_att_shape row = {1, 1, as.NH, as.NKV, as.hs, NULL};
            double worst = 0;
            for (size_t bt = 0; bt < (size_t)as.B * as.T; bt++) {
                REF(rope_fwd, (dt_act *)(y0 + bt * W), CF(inv), hpos[bt], &row);
                for (size_t i = 0; i < W; i++) worst = fmax(worst, fabs((double)y0[bt * W + i] - CF(y)[bt * W + i]));
            }
            printf("  %-44s max err %.3e%s\n", "cpu rope packed: each row at its position", worst,
                   worst == 0 ? "" : "  FAIL");
            count_failure(worst == 0);
            free(y0);
            pair_free(&y);
        }
        REF(rope_bwd, CA(d), CF(inv), pos0, &as);
        DEV(rope_bwd, GA(d), GF(inv), pos0, &das);
        compare(k ? "rope_bwd (in place, theta 5e5)" : "rope_bwd (in place, theta 1e4)", &d, n, tol);
        free(f);
        pair_free(&inv); pair_free(&x); pair_free(&d);
    }
    free(hpos);
    pair_free(&pp);
}

/* s: N F: SwiGLU over rows [gate | up] (ops.h swiglu_fwd, swiglu_bwd, which overwrites) */
static void case_swiglu(const int *s, double tol) {
    const int N = s[0], F = s[1];
    if (!has_ops("swiglu", g_dev->ops->swiglu_fwd && g_dev->ops->swiglu_bwd)) return;
    printf("  swiglu N %d F %d:\n", N, F);
    pair inp = pair_rand(K_ACT, (size_t)N * 2 * F, -6, 6), out = pair_new(K_ACT, NULL, (size_t)N * F);
    pair dout = pair_rand(K_ACT, (size_t)N * F, -1, 1), dinp = pair_rand(K_ACT, (size_t)N * 2 * F, -1, 1);
    REF(swiglu_fwd, CA(out), CA(inp), N, F);
    DEV(swiglu_fwd, GA(out), GA(inp), N, F);
    compare("swiglu_fwd", &out, out.n, tol);
    REF(swiglu_bwd, CA(dinp), CA(inp), CA(dout), N, F);
    DEV(swiglu_bwd, GA(dinp), GA(inp), GA(dout), N, F);
    compare("swiglu_bwd (overwritten)", &dinp, dinp.n, tol);
    pair_free(&inp); pair_free(&out); pair_free(&dout); pair_free(&dinp);
}

/* s: n */
static void case_gelu(const int *s, double tol) {
    const size_t n = (size_t)s[0];
    pair x = pair_rand(K_ACT, n, -4, 4), y = pair_rand(K_ACT, n, -1, 1), out = pair_new(K_ACT, NULL, n);
    printf("  gelu n %zu:\n", n);
    REF(gelu_fwd, CA(out), CA(x), n);
    DEV(gelu_fwd, GA(out), GA(x), n);
    compare("gelu_fwd", &out, n, tol);
    REF(gelu_bwd, CA(out), CA(x), CA(y), n);
    DEV(gelu_bwd, GA(out), GA(x), GA(y), n);
    compare("gelu_bwd", &out, n, tol);
    pair_free(&x); pair_free(&y); pair_free(&out);
}

/* s: n */
static void case_add(const int *s, double tol) {
    const size_t n = (size_t)s[0];
    pair x = pair_rand(K_ACT, n, -4, 4), y = pair_rand(K_ACT, n, -1, 1), out = pair_new(K_ACT, NULL, n);
    printf("  add n %zu:\n", n);
    REF(add, CA(out), CA(x), CA(y), n);
    DEV(add, GA(out), GA(x), GA(y), n);
    compare("add", &out, n, tol);
    REF(add, CA(x), CA(x), CA(y), n); /* out aliasing a */
    DEV(add, GA(x), GA(x), GA(y), n);
    compare("add in place", &x, n, tol);
    pair_free(&x); pair_free(&y); pair_free(&out);
}

/* s: n; tol for scale, sumsq to 1e-9 relative and bit-identical on rerun; over every element,
 * then over three ranges with gaps between them (a shard's buckets: one call each) */
static void case_scale_sumsq(const int *s, double tol) {
    const size_t n = (size_t)s[0];
    pair x = pair_rand(K_F32, n, -4, 4), out = pair_new(K_F32, NULL, 2); /* out: one double */
    const dt_range all = {0, n}, some[3] = {{0, n / 3}, {n / 3 + n / 5, n / 7}, {n - n / 11, n / 11}};
    printf("  scale, sumsq n %zu:\n", n);
    for (int k = 0; k < 2; k++) {
        const dt_range *r = k ? some : &all;
        const int nr = k ? 3 : 1;
        REF(scale, CF(x), r, nr, -0.37f);
        DEV(scale, GF(x), r, nr, -0.37f);
        compare(k ? "scale over 3 ranges" : "scale", &x, n, tol);
        double sc, sg, sg2;
        REF(sumsq, (double *)out.c, CF(x), r, nr);
        sc = *(const double *)out.c;
        DEV(sumsq, (double *)out.g, GF(x), r, nr);
        DEV(download, &sg, out.g, sizeof sg);
        DEV(sumsq, (double *)out.g, GF(x), r, nr);
        DEV(download, &sg2, out.g, sizeof sg2);
        dev_ok();
        int ok = fabs(sc - sg) <= 1e-9 * fabs(sc) && sg == sg2;
        printf("  %-44s cpu %.15g %s %.15g%s\n", k ? "sumsq over 3 ranges (double, deterministic)"
                                                   : "sumsq (double, deterministic)", sc, g_dev->ops->name, sg,
               ok ? "" : "  FAIL");
        count_failure(ok);
    }
    pair_free(&x);
    pair_free(&out);
}

/* s: n; the training loss's sum on the device: acc += the losses of the rows with a target (some
 * are -1: ignored), then of every row, onto 1.5; to 1e-12 relative */
static void case_loss_sum(const int *s, double tol) {
    (void)tol;
    const int n = s[0];
    int *tg = rand_ints((size_t)n, 0, 4);
    for (int i = 0; i < n; i += 3) tg[i] = -1;
    pair t = pair_ints(tg, (size_t)n), losses = pair_rand(K_F32, (size_t)n, 0, 8), acc = pair_new(K_F32, NULL, 2);
    const double start = 1.5;
    REF(upload, acc.c, &start, sizeof start);
    DEV(upload, acc.g, &start, sizeof start);
    for (int k = 0; k < 2; k++) {
        REF(loss_sum, (double *)acc.c, CF(losses), k ? NULL : (const int *)t.c, n);
        DEV(loss_sum, (double *)acc.g, GF(losses), k ? NULL : (const int *)t.g, n);
    }
    double sc = *(const double *)acc.c, sg;
    DEV(download, &sg, acc.g, sizeof sg);
    dev_ok();
    const int ok = fabs(sc - sg) <= 1e-12 * fabs(sc);
    printf("  %-44s cpu %.15g %s %.15g%s\n", "loss_sum (rows with a target, then all)", sc, g_dev->ops->name, sg,
           ok ? "" : "  FAIL");
    count_failure(ok);
    free(tg);
    pair_free(&t);
    pair_free(&losses);
    pair_free(&acc);
}

/* s: N V ld (softmax cross-entropy, probabilities in place as the model does, and argmax).
 * ld: the rows' stride, 0 the device's logits_stride (as the model calls), -1 V; the columns
 * past V hold random values that neither backend may read or write (compared with the rest). */
static void case_xent(const int *s, double tol) {
    const int N = s[0], V = s[1], ld = s[2] == 0 ? g_dev->ops->logits_stride(V) : s[2] < 0 ? V : s[2];
    char what[80];
    int *tg = rand_ints((size_t)N, 0, V);
    tg[1 % N] = -1; /* an ignored row */
    printf("  xent rows %d apart:\n", ld);
    pair t = pair_ints(tg, (size_t)N), logits = pair_rand(K_ACT, (size_t)N * ld, -6, 6);
    pair losses = pair_new(K_F32, NULL, (size_t)N);
    REF(xent_fwd, CF(losses), CA(logits), CA(logits), t.c, N, V, ld);
    DEV(xent_fwd, GF(losses), GA(logits), GA(logits), t.g, N, V, ld);
    snprintf(what, sizeof what, "xent_fwd losses %dx%d", N, V);
    compare_floor(what, &losses, losses.n, tol, 1e-2);
    snprintf(what, sizeof what, "xent_fwd probs (in place) %dx%d", N, V);
    compare(what, &logits, logits.n, tol);
    ref_takes_dev(&logits); /* argmax and xent_bwd from the probabilities the device stored */
    pair idx = pair_new(K_I32, NULL, (size_t)N);
    REF(argmax, idx.c, CA(logits), N, V, ld);
    DEV(argmax, idx.g, GA(logits), N, V, ld);
    snprintf(what, sizeof what, "argmax %dx%d", N, V);
    compare_ints(what, &idx);
    REF(xent_bwd, CA(logits), CA(logits), t.c, 0.25f, N, V, ld);
    DEV(xent_bwd, GA(logits), GA(logits), t.g, 0.25f, N, V, ld);
    snprintf(what, sizeof what, "xent_bwd (in place, ignored row) %dx%d", N, V);
    compare(what, &logits, logits.n, tol);
    if (g_dev->ops->xent_fused) { /* the device's one pass against the CPU's two */
        pair lg = pair_rand(K_ACT, (size_t)N * ld, -6, 6), ls = pair_new(K_F32, NULL, (size_t)N);
        REF(xent_fwd, CF(ls), CA(lg), CA(lg), t.c, N, V, ld);
        REF(xent_bwd, CA(lg), CA(lg), t.c, 0.25f, N, V, ld);
        DEV(xent_fused, GF(ls), GA(lg), GA(lg), t.g, 0.25f, N, V, ld);
        snprintf(what, sizeof what, "xent_fused losses %dx%d", N, V);
        compare_floor(what, &ls, ls.n, tol, 1e-2);
        snprintf(what, sizeof what, "xent_fused dlogits (in place, ignored row) %dx%d", N, V);
        compare(what, &lg, lg.n, tol);
        pair_free(&lg); pair_free(&ls);
    }
    free(tg);
    pair_free(&t); pair_free(&logits); pair_free(&losses); pair_free(&idx);
}

/* the cross-entropy's losses on rows with NaN or -inf logits: on the device a NaN anywhere in a
 * row makes its loss NaN (so the trainer's non-finite check sees it), whether or not the thread
 * that met it met anything finite (the CPU is no reference there: its fast exp clamps a NaN,
 * ops_cpu.c fast_expf); -inf logits are probability 0, as on the CPU. Forward and fused. */
static void case_xent_special(const int *s, double tol) {
    (void)s;
    (void)tol;
    enum { N = 5, V = 1100 }; /* over the kernel's 512 threads: some threads see 2 elements, some 3 */
    static const char *rows[N] = {"one NaN", "NaN at the target", "NaN, the rest -inf but one", "-inf but two",
                                  "-inf but the target"};
    const int ld = g_dev->ops->logits_stride(V);
    float *h = rand_host((size_t)N * ld, -3, 3);
    int tg[N] = {5, 40, 900, 1, 17};
    h[0 * ld + 600] = NAN;
    h[1 * ld + 40] = NAN;
    for (int k = 0; k < V; k++) h[2 * ld + k] = h[3 * ld + k] = h[4 * ld + k] = -INFINITY;
    h[2 * ld + 3] = NAN;
    h[2 * ld + 900] = 1.0f;
    h[3 * ld + 1] = 0.5f;
    h[3 * ld + 1000] = 2.0f;
    h[4 * ld + 17] = 4.0f;
    pair t = pair_ints(tg, N);
    for (int fused = 0; fused < 1 + !!g_dev->ops->xent_fused; fused++) {
        pair x = pair_new(K_ACT, h, (size_t)N * ld), losses = pair_new(K_F32, NULL, N);
        REF(xent_fwd, CF(losses), CA(x), CA(x), t.c, N, V, ld);
        if (fused) DEV(xent_fused, GF(losses), GA(x), GA(x), t.g, 1.0f, N, V, ld);
        else DEV(xent_fwd, GF(losses), GA(x), GA(x), t.g, N, V, ld);
        const float *c = (const float *)losses.c, *g = dev_download(&losses);
        for (int i = 0; i < N; i++) {
            const int ok = i < 3 ? isnan(g[i]) != 0 : fabsf(g[i] - c[i]) <= 1e-5f * fmaxf(1.0f, fabsf(c[i]));
            printf("  %s loss, %-30s cpu %-12g %s %-12g%s\n", fused ? "xent_fused" : "xent_fwd", rows[i], (double)c[i],
                   g_dev->ops->name, (double)g[i], ok ? "" : i < 3 ? "  FAIL (expected NaN)" : "  FAIL");
            count_failure(ok);
        }
        free((void *)g);
        pair_free(&x); pair_free(&losses);
    }
    free(h);
    pair_free(&t);
}

/* argmax on rows the softmax never produces: ties, -inf, NaN; the CPU's answer is the
 * reference (the first maximum; NaNs never compare greater, so a NaN in column 0 wins) */
static void case_argmax_special(const int *s, double tol) {
    (void)s;
    (void)tol;
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
    pair x = pair_new(K_ACT, h, (size_t)N * V), idx = pair_new(K_I32, NULL, N);
    REF(argmax, idx.c, CA(x), N, V, V);
    DEV(argmax, idx.g, GA(x), N, V, V);
    int *g = dev_download(&idx);
    for (int i = 0; i < N; i++) {
        const int c = ((const int *)idx.c)[i];
        printf("  argmax, %-37s cpu %d %s %d%s\n", rows[i], c, g_dev->ops->name, g[i], g[i] == c ? "" : "  FAIL");
        count_failure(g[i] == c);
    }
    free(g);
    free(h);
    pair_free(&x); pair_free(&idx);
}

/* s: n C R: out(n, C) = x(R, C)[rows] and back; rows repeat (they accumulate in order) */
static void case_rows(const int *s, double tol) {
    static const int rows6[] = {3, 0, 8, 3, 5, 3};
    const int n = s[0], C = s[1], R = s[2];
    int *rows = rand_ints((size_t)n, 0, R);
    if (n == 6 && R > 8) memcpy(rows, rows6, sizeof rows6);
    pair r = pair_ints(rows, (size_t)n), x = pair_rand(K_ACT, (size_t)R * C, -1, 1);
    pair out = pair_new(K_ACT, NULL, (size_t)n * C);
    printf("  rows n %d C %d of %d:\n", n, C, R);
    REF(gather_rows, CA(out), CA(x), r.c, n, C);
    DEV(gather_rows, GA(out), GA(x), r.g, n, C);
    compare("gather_rows", &out, out.n, 0);
    REF(scatter_add_rows, CA(x), CA(out), r.c, n, C);
    DEV(scatter_add_rows, GA(x), GA(out), r.g, n, C);
    compare("scatter_add_rows (+=)", &x, x.n, tol);
    free(rows);
    pair_free(&r); pair_free(&x); pair_free(&out);
}

/* s: n; pieces: the first half of the parameters (with decay), then the rest in two stretches
 * (without, with) whose moments are stored in the other order, as a shard's could be */
static void case_adamw(const int *s, double tol) {
    const size_t n = (size_t)s[0], h = n / 2, q = (n - h) / 2;
    pair p = pair_rand(K_F32, n, -1, 1), g = pair_rand(K_F32, n, -1, 1), m = pair_rand(K_F32, n, -0.1f, 0.1f);
    pair v = pair_rand(K_F32, n, 0, 0.01f);
    const dt_adamw_piece pieces[3] = {{0, 0, h, 1}, {h, n - q, q, 0}, {h + q, h, n - h - q, 1}};
    printf("  adamw n %zu (3 pieces):\n", n);
    for (int t = 1; t <= 3; t++) {
        REF(adamw, CF(p), CF(g), CF(m), CF(v), pieces, 3, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
        DEV(adamw, GF(p), GF(g), GF(m), GF(v), pieces, 3, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    }
    compare("adamw params (3 steps)", &p, n, tol);
    compare("adamw first moment", &m, n, tol);
    compare("adamw second moment", &v, n, tol);
    pair_free(&p); pair_free(&g); pair_free(&m); pair_free(&v);
}

/* ---- the whole model ---- */

/* The model of config mc on backend be, with the backend's scratch reserved for its op sizes as
 * a worker reserves it (CUDA then makes the padded bf16 output head its products use) */
static dt_model *model_on(dt_backend *be, const dt_model_cfg *mc) {
    dt_model *m = NULL;
    dt_op_sizes sizes;
    dt_model_op_sizes(mc, &sizes);
    if (dt_model_init(&m, mc, be) != DT_OK || (be->ops->reserve && be->ops->reserve(be->ctx, &sizes) != DT_OK)) {
        fprintf(stderr, "%s\n", dt_error_msg());
        exit(1);
    }
    return m;
}

/* The model of config mc on both backends: the loss of one batch and every tensor's gradient. */
static void model_compare(const dt_model_cfg *mcfg, double tol) {
    const dt_model_cfg mc = *mcfg;
    const int V = mc.shape.vocab_size, T = mc.seq_len, B = mc.max_batch, num_labels = mc.shape.num_labels;
    dt_model *mcpu = model_on(g_ref, &mc), *mdev = model_on(g_dev, &mc);
    if (mc.lora.rank) { /* adapters away from B = 0, the same on both: of a size training gives them (large ones
                           saturate the softmax, whose gradient then cancels to what bf16 cannot hold) */
        const size_t np = dt_model_num_params(mcpu);
        float *h = rand_host(np, -0.05f, 0.05f);
        REF(upload, dt_model_params(mcpu), h, np * sizeof(float));
        DEV(upload, dt_model_params(mdev), h, np * sizeof(float));
        dt_model_params_changed(mdev);
        free(h);
    }
    int *tok = rand_ints((size_t)B * T, 1, V);
    int *tg = num_labels ? rand_ints((size_t)B, 0, num_labels) : rand_ints((size_t)B * T, 0, V);
    if (!num_labels && B * T > 1) tg[B * T / 2] = -1; /* an ignored position */
    dt_fwd_result rc, rg;
    CHECK_OK(dt_model_forward(mcpu, tok, tg, B, &rc));
    CHECK_OK(dt_model_forward(mdev, tok, tg, B, &rg));
    double lc = rc.loss_sum / (double)rc.rows, lg = rg.loss_sum / (double)rg.rows;
    int ok = fabs(lc - lg) <= tol * fabs(lc) && rc.rows == rg.rows;
    printf("  loss: cpu %.7f %s %.7f%s\n", lc, g_dev->ops->name, lg, ok ? "" : "  FAIL");
    count_failure(ok);
    CHECK_OK(dt_model_backward(mcpu, 1.0f / (float)rc.rows, NULL, NULL));
    CHECK_OK(dt_model_backward(mdev, 1.0f / (float)rg.rows, NULL, NULL));
    dev_ok();
    size_t n = dt_model_num_params(mcpu);
    const float *c = dt_model_grads(mcpu);
    float *g = malloc(n * sizeof(float));
    CHECK(g);
    DEV(download, g, dt_model_grads(mdev), n * sizeof(float));
    dev_ok();
    /* per tensor: one that is wrong cannot hide in the total. A tensor's error relative to its
     * own norm, floored at a tenth of the largest tensor's: rounding errors scale with the
     * magnitudes that enter a sum, so a small gradient that is the cancellation of large terms
     * (ln_f.bias of a tiny classifier in bf16) carries the error of those terms; a wrong index
     * is an O(1) error either way */
    double largest = 0, worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < dt_model_num_tensors(mcpu); i++) {
        const dt_tensor_info *t = dt_model_tensor(mcpu, i);
        double den = 0;
        for (size_t k = 0; k < t->numel; k++) den += (double)c[t->offset + k] * c[t->offset + k];
        largest = fmax(largest, sqrt(den));
    }
    for (int i = 0; i < dt_model_num_tensors(mcpu); i++) {
        const dt_tensor_info *t = dt_model_tensor(mcpu, i);
        double num = 0, den = 0;
        for (size_t k = 0; k < t->numel; k++) {
            double d = (double)g[t->offset + k] - c[t->offset + k];
            num += d * d;
            den += (double)c[t->offset + k] * c[t->offset + k];
        }
        if (den == 0 && num == 0) continue; /* e.g. wte rows of tokens never seen */
        double rel = sqrt(num) / fmax(fmax(sqrt(den), 0.1 * largest), 1e-30);
        if (rel > worst) { worst = rel; worst_name = t->name; }
    }
    ok = worst <= tol;
    printf("  gradients: worst tensor %s rel L2 %.3e (tol %.0e)%s\n", worst_name, worst, tol, ok ? "" : "  FAIL");
    count_failure(ok);
    free(g);
    free(tok);
    free(tg);
    dt_model_free(mcpu);
    dt_model_free(mdev);
}

/* s: V L NH C T B num_labels: a GPT-2 classifier of num_labels classes, or a language model (0),
 * of V tokens, L layers, NH heads, width C on B sequences of T tokens. An odd C puts most biases
 * of the parameter buffer at 4-byte alignment. Loss and every tensor's gradient. */
static void case_model(const int *s, double tol) {
    const int V = s[0], L = s[1], NH = s[2], C = s[3], T = s[4], B = s[5], num_labels = s[6];
    dt_model_cfg mc = {.shape = {.vocab_size = V, .n_positions = T + 8, .n_layer = L, .n_head = NH, .n_embd = C, .num_labels = num_labels},
                       .seq_len = T, .max_batch = B, .seed = 1234};
    printf("  model V %d L %d NH %d C %d T %d B %d (%s):\n", V, L, NH, C, T, B, num_labels ? "classification" : "LM");
    model_compare(&mc, tol);
}

/* s: V L NH NKV C hs I T B flags: a Llama-family model (RMSNorm, RoPE, grouped-query attention
 * of NH query and NKV key/value heads of hs (0: C/NH), SwiGLU MLP of width I, no learned
 * positions) of V tokens, L layers, width C on B sequences of T tokens; flags: 1 tied head, 2
 * attention biases, 4 a classifier of 2 classes (else a language model). */
static void case_llama(const int *s, double tol) {
    const int V = s[0], L = s[1], NH = s[2], NKV = s[3], C = s[4], hs = s[5], I = s[6], T = s[7], B = s[8], f = s[9];
    if (!has_ops("llama model", g_dev->ops->rmsnorm_fwd && g_dev->ops->rope_fwd && g_dev->ops->swiglu_fwd)) return;
    dt_model_cfg mc = {.shape = {.arch = DT_ARCH_LLAMA, .vocab_size = V, .n_positions = T + 8, .n_layer = L,
                                 .n_head = NH, .n_embd = C, .num_key_value_heads = NKV, .head_dim = hs,
                                 .intermediate_size = I, .rope_theta = 10000.0, .rms_norm_eps = 1e-5,
                                 .tie_word_embeddings = f & 1, .attention_bias = !!(f & 2), .num_labels = f & 4 ? 2 : 0},
                       .seq_len = T, .max_batch = B, .seed = 4321};
    printf("  llama V %d L %d NH %d NKV %d C %d hs %d I %d T %d B %d%s%s (%s):\n", V, L, NH, NKV, C,
           dt_shape_head_dim(&mc.shape), I, T, B, f & 1 ? ", tied head" : "", f & 2 ? ", attention biases" : "",
           f & 4 ? "classification" : "LM");
    model_compare(&mc, tol);
}

/* s: arch rank base16 V L C T B num_labels: model.lora (rank on every projection) on a GPT-2
 * (arch 0) or a Llama with GQA (1), its base in bf16 (base16 1: model.lora.base_dtype) or fp32;
 * random adapters. Loss and every trainable tensor's gradient. */
static void case_lora_model(const int *s, double tol) {
    const int llama = s[0], r = s[1], b16 = s[2], V = s[3], L = s[4], C = s[5], T = s[6], B = s[7], NL = s[8];
    if (!has_ops("lora model", g_dev->ops->lora_fwd && g_dev->ops->lora_bwd)) return;
    if (b16 && !base16_runs("lora model, base in bf16")) return;
    dt_model_cfg mc = {.shape = {.vocab_size = V, .n_positions = T + 8, .n_layer = L, .n_head = 4, .n_embd = C,
                                 .num_labels = NL},
                       .seq_len = T, .max_batch = B, .seed = 777};
    if (llama)
        mc.shape = (dt_model_shape){.arch = DT_ARCH_LLAMA, .vocab_size = V, .n_positions = T + 8, .n_layer = L,
                                    .n_head = 4, .n_embd = C, .num_key_value_heads = 2, .intermediate_size = 2 * C,
                                    .rope_theta = 10000.0, .rms_norm_eps = 1e-5, .tie_word_embeddings = 1,
                                    .num_labels = NL};
    mc.lora = (dt_lora){.rank = r, .alpha = 2.0 * r, .targets = dt_lora_arch_targets(mc.shape.arch), .base_bf16 = b16};
    printf("  lora %s V %d L %d C %d T %d B %d rank %d, base in %s (%s):\n", llama ? "llama" : "gpt2", V, L, C, T, B, r,
           b16 ? "bf16" : "fp32", NL ? "classification" : "LM");
    model_compare(&mc, tol);
}

/* A few optimizer steps on both backends: after each AdamW update the next forward reads the
 * weights again (with bf16 products: the working copy the AdamW kernel rewrote in the same
 * pass), so a stale or misplaced copy shows up as a different loss. s: steps */
static void case_training(const int *s, double tol) {
    dt_model_cfg mc = {.shape = {.vocab_size = 67, .n_positions = 24, .n_layer = 2, .n_head = 4, .n_embd = 32, .num_labels = 0},
                       .seq_len = 16, .max_batch = 3, .seed = 99};
    dt_backend *bes[2] = {g_ref, g_dev};
    dt_model *mod[2];
    dt_optim *opt[2];
    dt_optim_cfg oc = {.lr = 1e-2, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0,
                       .schedule = DT_SCHED_CONSTANT, .warmup_steps = 0, .total_steps = 10, .min_lr_ratio = 0.1};
    for (int k = 0; k < 2; k++) {
        mod[k] = model_on(bes[k], &mc);
        int nt = dt_model_num_tensors(mod[k]);
        dt_param_seg *segs = calloc((size_t)nt, sizeof *segs);
        CHECK(segs);
        for (int i = 0; i < nt; i++) {
            const dt_tensor_info *t = dt_model_tensor(mod[k], i);
            segs[i] = (dt_param_seg){t->offset, t->numel, t->ndim >= 2};
        }
        CHECK_OK(dt_optim_init(&opt[k], &oc, bes[k], dt_model_num_params(mod[k]), segs, nt));
        free(segs);
    }
    const int B = 3, T = mc.seq_len;
    int *tok = rand_ints((size_t)B * T, 0, mc.shape.vocab_size), *tg = rand_ints((size_t)B * T, 0, mc.shape.vocab_size);
    double worst = 0;
    for (int step = 0; step < s[0]; step++) {
        double loss[2];
        for (int k = 0; k < 2; k++) {
            dt_fwd_result r;
            double gn, lr;
            dt_model_zero_grad(mod[k]);
            /* as the trainer: the training forward (on a device with xent_fused, the loss and
             * the logits' gradient in one pass), with the scale backward then gets */
            const float sc = 1.0f / (float)(B * T);
            CHECK_OK(dt_model_forward_loss(mod[k], tok, tg, B, sc, &r));
            CHECK_OK(dt_model_backward(mod[k], sc, NULL, NULL));
            CHECK_OK(dt_optim_step(opt[k], dt_model_params(mod[k]), dt_model_grads(mod[k]), step, &gn, &lr));
            loss[k] = r.loss_sum / (double)r.rows;
        }
        worst = fmax(worst, fabs(loss[1] - loss[0]) / fabs(loss[0]));
        printf("  training step %d: loss cpu %.7f %s %.7f\n", step + 1, loss[0], g_dev->ops->name, loss[1]);
    }
    int ok = worst <= tol;
    printf("  %-44s worst rel %.3e (tol %.0e)%s\n", "losses over AdamW steps", worst, tol, ok ? "" : "  FAIL");
    count_failure(ok);
    free(tok);
    free(tg);
    for (int k = 0; k < 2; k++) {
        dt_optim_free(opt[k]);
        dt_model_free(mod[k]);
    }
}

/* ---- the table ---- */

/* The mock GPU's count of queued work and of the host's waits for the device
 * (tests/mockgpu/mock_api.h); NULL on a real GPU. */
extern void mock_launch_counts(unsigned long *kernels, unsigned long *library) __attribute__((weak));
extern unsigned long mock_sync_count(void) __attribute__((weak));

/* How many kernels and library calls one training step queues, counted by the mock GPU: a
 * GPT-2-shaped language model (s: L layers; small widths, the count depends on the layers, not
 * on the sizes) after one step has made the plans; zero_grad, forward, backward, the optimizer
 * step with clipping, as the trainer runs it with one worker (worker.c train_step: the loss and
 * the norm read at the step's one check). The launches for 12 layers are checked against the
 * table in docs/PERFORMANCE.md; the waits for the device must be that one check. */
static void case_launches(const int *s, double tol) {
    (void)tol;
    if (!mock_launch_counts) {
        printf("  %-44s only counted on the mock GPU\n", "kernel launches per training step");
        return;
    }
    dt_model_cfg mc = {.shape = {.vocab_size = 128, .n_positions = 32, .n_layer = s[0], .n_head = 2, .n_embd = 16, .num_labels = 0},
                       .seq_len = 16, .max_batch = 2, .seed = 5};
    dt_model *m = model_on(g_dev, &mc);
    const int nt = dt_model_num_tensors(m);
    dt_param_seg *segs = calloc((size_t)nt, sizeof *segs);
    CHECK(segs);
    for (int i = 0; i < nt; i++) {
        const dt_tensor_info *t = dt_model_tensor(m, i);
        segs[i] = (dt_param_seg){t->offset, t->numel, t->ndim >= 2};
    }
    dt_optim_cfg oc = {.lr = 1e-3, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1e-3,
                       .schedule = DT_SCHED_CONSTANT, .total_steps = 10};
    dt_optim *o;
    CHECK_OK(dt_optim_init(&o, &oc, g_dev, dt_model_num_params(m), segs, nt));
    free(segs);
    const int B = 2, T = mc.seq_len;
    int *tok = rand_ints((size_t)B * T, 0, mc.shape.vocab_size), *tg = rand_ints((size_t)B * T, 0, mc.shape.vocab_size);
    unsigned long k0 = 0, l0 = 0, k1 = 0, l1 = 0, y0 = 0, y1 = 0;
    for (int step = 0; step < 2; step++) {
        if (step == 1) {
            mock_launch_counts(&k0, &l0);
            y0 = mock_sync_count ? mock_sync_count() : 0;
        }
        long rows;
        double gn, lr;
        float *p = dt_model_params(m), *g = dt_model_grads(m);
        dt_model_zero_grad(m);
        CHECK_OK(dt_model_forward_train(m, tok, tg, B, 1.0f / (float)(B * T), &rows)); /* as the trainer does */
        CHECK_OK(dt_model_backward(m, 1.0f / (float)(B * T), NULL, NULL));
        dt_optim_norm(o, g);
        dt_model_loss_fetch(m);
        CHECK_OK(g_dev->ops->check(g_dev->ctx)); /* the step's one wait */
        CHECK(rows == B * T && dt_model_loss_fetched(m) > 0);
        CHECK_OK(dt_optim_update(o, p, g, step, dt_optim_norm_sumsq(o), &gn, &lr));
    }
    mock_launch_counts(&k1, &l1);
    y1 = mock_sync_count ? mock_sync_count() : 0;
    const int bf16 = g_dev->ops->bf16(g_dev->ctx);
    printf("  kernel launches per training step, %d layers (%s): %lu kernels + %lu library calls (cuBLASLt, CUB); %lu "
           "waits for the device\n", mc.shape.n_layer, bf16 ? "bf16 products" : "fp32", k1 - k0, l1 - l0, y1 - y0);
    if (mock_sync_count && y1 - y0 != 1) {
        printf("  FAIL: expected one wait for the device a step (the check that reads the loss and the norm)\n");
        count_failure(0);
    }
    /* the figures docs/PERFORMANCE.md gives for 12 layers (with cuBLASLt's bias epilogue, as the
     * mock has it unless told otherwise): a change of the launches updates both. Attention on
     * the backend's kernels (the mock's cuDNN makes no handle), or fused (tests/mockgpu's
     * mock_att.c in place of cuDNN: no kernel of ours, one library call forward and one
     * backward a layer in place of six batched products). */
    size_t att_b, datt_b;
    const dt_att_shape as = {B, T, mc.shape.n_head, mc.shape.n_head, mc.shape.n_embd / mc.shape.n_head, NULL};
    const int fused = !g_dev->ops->attention_bytes(g_dev->ctx, &as, bf16, &att_b, &datt_b);
    const unsigned long want_k = !bf16 ? 241 : fused ? 157 : 385, want_l = fused ? 172 : 220;
    const int plain = !getenv("MOCK_LT_NO_BIAS_EPILOGUE") && !getenv("MOCK_LT_NO_BF16") &&
                      !getenv("MOCK_LT_NO_GELU_EPILOGUE") && !getenv("MOCK_LT_NO_BGRAD_EPILOGUE");
    if (fused) printf("  (attention fused: its kernels are the library's)\n");
    if (mc.shape.n_layer == 12 && plain && (k1 - k0 != want_k || l1 - l0 != want_l)) {
        printf("  FAIL: expected %lu kernels + %lu library calls (docs/PERFORMANCE.md's table): update it if the change "
               "is meant\n", want_k, want_l);
        count_failure(0);
    }
    free(tok);
    free(tg);
    dt_optim_free(o);
    dt_model_free(m);
}

extern size_t mock_device_in_use(void) __attribute__((weak));

/* s: L NH C T B [NKV hs I packed]: GPT-2, or with I > 0 a Llama-family model (NKV key/value heads of
 * hs, SwiGLU width I); packed 1: rows packed from examples (data.packing: fused attention adds a
 * mask per row, the positions are uploaded beside the tokens). What --dry-run and the start-up report estimate for training this shape
 * (dt_model_memory_bytes, the AdamW moments, the backend's scratch_bytes: what worker.c adds)
 * against what a fresh backend of the same kind and precision allocates for it (model, moments,
 * reserve), as the mock GPU counts device memory. The estimate assumes the fused attention
 * plans; the allocation asks the open backend (attention_bytes), so the two agree where it
 * plans and the allocation is larger by the probabilities where it does not. */
static void case_memory(const int *s, double tol) {
    (void)tol;
    if (!mock_device_in_use) {
        printf("  %-44s only counted on the mock GPU\n", "device memory against the estimate");
        return;
    }
    const int L = s[0], NH = s[1], C = s[2], T = s[3], B = s[4], bf16 = g_dev->ops->bf16(g_dev->ctx);
    dt_model_cfg mc = {.shape = {.vocab_size = 256, .n_positions = T, .n_layer = L, .n_head = NH, .n_embd = C, .num_labels = 0},
                       .seq_len = T, .max_batch = B, .seed = 5};
    if (s[7]) { /* Llama */
        mc.shape = (dt_model_shape){.arch = DT_ARCH_LLAMA, .vocab_size = 256, .n_positions = T, .n_layer = L,
                                    .n_head = NH, .n_embd = C, .num_key_value_heads = s[5], .head_dim = s[6],
                                    .intermediate_size = s[7], .rope_theta = 1e4, .rms_norm_eps = 1e-5};
        if (!has_ops("llama memory", g_dev->ops->rmsnorm_fwd && g_dev->ops->rope_fwd && g_dev->ops->swiglu_fwd)) return;
    }
    static const int packed_mark = 0; /* any non-NULL pos: attention_bytes sees packed rows */
    mc.packed = s[8];
    const dt_att_shape as = {B, T, NH, dt_shape_kv_heads(&mc.shape), dt_shape_head_dim(&mc.shape),
                             mc.packed ? &packed_mark : NULL};
    dt_op_sizes sizes;
    dt_model_op_sizes(&mc, &sizes);
    const size_t n = dt_model_count_params(&mc);
    const size_t est = dt_model_memory_bytes(&mc, g_dev->ops, bf16) + 2 * n * sizeof(float) +
                       g_dev->ops->scratch_bytes(&sizes, bf16);
    if (mc.packed) { /* against the same rows unpacked: only the positions, and with a fused attention its
                        mask (B x T rows of bf16, 8-aligned T wide: cudnn_att.h's DTC_MASK_LD; its slot
                        in whole MiB); none of the fallback's scratch */
        dt_model_cfg mu = mc;
        mu.packed = 0;
        dt_att_shape au = as;
        au.pos = NULL;
        dt_op_sizes su;
        dt_model_op_sizes(&mu, &su);
        const size_t est_u = dt_model_memory_bytes(&mu, g_dev->ops, bf16) + 2 * n * sizeof(float) +
                             g_dev->ops->scratch_bytes(&su, bf16);
        size_t a0, d0, a1, d1;
        const int fused = !g_dev->ops->attention_bytes(NULL, &as, bf16, &a0, &d0) &&
                          !g_dev->ops->attention_bytes(NULL, &au, bf16, &a1, &d1);
        const size_t ld = ((size_t)T + 7) / 8 * 8,
                     mask = fused ? ((size_t)B * T * ld * 2 + (1u << 20) - 1) / (1u << 20) * (1u << 20) : 0;
        const long long d = (long long)est - (long long)est_u, want = (long long)((size_t)B * T * sizeof(int) + mask);
        printf("  %-44s %+lld bytes (want %+lld: positions%s)%s\n", "estimate packed - unpacked", d, want,
               fused ? " and the mask" : "", d == want ? "" : "  FAIL");
        count_failure(d == want);
    }
    const size_t before = mock_device_in_use();
    dt_backend *be;
    dt_backend_cfg cfg = {.device = 0, .precision = bf16, .rank = 0};
    CHECK_OK(dt_backend_open(DT_DEVICE_CUDA, &cfg, &be));
    dt_model *m = model_on(be, &mc);
    float *mom = NULL;
    CHECK_OK(be->ops->alloc(be->ctx, 2 * n * sizeof(float), "test moments", (void **)&mom));
    CHECK_OK(be->ops->reserve(be->ctx, &sizes));
    const size_t got = mock_device_in_use() - before;
    size_t att, datt, att0, datt0;
    const int probs = be->ops->attention_bytes(be->ctx, &as, bf16, &att, &datt);
    const int probs0 = g_dev->ops->attention_bytes(NULL, &as, bf16, &att0, &datt0); /* what the estimate took */
    /* the probabilities where the estimate assumed a fused attention that did not plan; what the
     * estimate cannot know: CUB's sort space (it asks the device) and the 8 bytes of the gradient
     * norm's result */
    const size_t extra = probs && !probs0 ? (size_t)L * (att - att0) + (datt - datt0) : 0;
    const long long diff = (long long)got - (long long)(est + extra);
    /* exact (up to those) where the estimate's assumption holds; else the fallback's scratch as
     * well: fp32 q, k, v, dy, dq, dk, dv and bf16 copies of attention's operands (each slot in
     * whole MiB) */
    const size_t nq = (size_t)B * T * NH * as.hs, nkv = (size_t)B * T * as.NKV * as.hs, pr = (size_t)B * NH * T * T;
    const long long slack = (1 << 20) + (long long)(extra ? (3 * nq + 4 * nkv) * 4 + nq * 2 + pr * 2 + (3 << 20) : 0);
    const int ok = diff >= 0 && diff <= slack;
    printf("  %-44s estimate %zu + %zu (probabilities), allocated %zu: %+lld%s\n",
           mc.packed ? "device memory against the estimate (packed)"
           : s[7]    ? "device memory against the estimate (llama)"
                     : "device memory against the estimate",
           est, extra, got, diff, ok ? "" : "  FAIL");
    count_failure(ok);
    be->ops->free(be->ctx, mom);
    dt_model_free(m);
    dt_backend_close(be);
}

#define NO_BF16 (-1.0) /* nothing of the op changes with bf16 products: run at fp32 only */
#define BF16_ONLY (-2.0) /* as tol32: the op is asked for with bf16 products only (a bf16 base): run at bf16 only */

typedef struct op_case {
    const char *op;                  /* what --op selects */
    void (*run)(const int *s, double tol);
    int full[10], quick[10];         /* shapes; quick all 0: the full shape */
    double tol32, tol16;             /* tolerances at fp32 and with bf16 products */
} op_case;

static const op_case cases[] = {
    {"encoder", case_encoder, {3, 64, 96, 50}, {3, 17, 24, 50}, 1e-6, 1e-2},
    {"encoder", case_encoder, {1, 1, 1, 2}, {0}, 1e-6, 1e-2},
    {"encoder", case_encoder, {2, 5, 257, 3}, {0}, 1e-6, 1e-2}, /* C over one block of threads, long runs */
    {"encoder", case_encoder, {3, 64, 96, 50, 1}, {3, 17, 24, 50, 1}, 1e-6, 1e-2}, /* no wpe (Llama) */
    {"encoder", case_encoder, {2, 5, 257, 3, 1}, {0}, 1e-6, 1e-2},
    /* long runs, summed in chunks of 64 sorted positions (another order than the CPU's): a
     * classifier's padding (runs of >= 512; V 1000, 10 key bits, token 999 among them), and one
     * token everywhere */
    {"encoder", case_encoder, {4, 512, 96, 1000, 0, 1}, {2, 160, 24, 1000, 0, 1}, 3e-5, 1e-2},
    {"encoder", case_encoder, {3, 100, 257, 5, 1, 2}, {0}, 3e-5, 1e-2}, /* 4 whole chunks and 44 more */
    {"encoder", case_encoder, {3, 64, 96, 50, 0, 0, 1}, {3, 17, 24, 50, 0, 0, 1}, 1e-6, 1e-2}, /* packed rows */
    {"parts", case_parts, {3, 64, 96, 1000, 250, 250, 0, 37}, {2, 17, 24, 100, 25, 25, 0, 9}, 1e-5, 1e-2},
    {"parts", case_parts, {2, 100, 257, 50, 0, 13, 1, 5}, {0}, 3e-5, 1e-2}, /* first share, long runs skipped */
    {"parts", case_parts, {1, 3, 5, 10, 7, 3, 0, 1}, {0}, 1e-5, 1e-2},       /* last share, one row */
    {"layernorm", case_layernorm, {300, 768, -2, 3}, {19, 40, -2, 3}, 1e-5, 1e-2},
    {"layernorm", case_layernorm, {1, 1, -1, 1}, {0}, 1e-5, 1e-2},
    {"layernorm", case_layernorm, {3, 31, 100, 101}, {0}, 1e-5, 1e-2},
    {"layernorm", case_layernorm, {33000, 3, -1, 1}, {1000, 3, -1, 1}, 1e-5, 1e-2}, /* over 1024 groups of 32 rows */
    {"layernorm", case_layernorm, {5, 2000, -1, 1}, {0}, 1e-5, 1e-2},
    {"rmsnorm", case_rmsnorm, {300, 768, -2, 3, 5}, {19, 40, -2, 3, 5}, 1e-5, 1e-2},
    {"rmsnorm", case_rmsnorm, {1, 1, -1, 1, 6}, {0}, 1e-5, 1e-2},
    {"rmsnorm", case_rmsnorm, {3, 31, 100, 101, 6}, {0}, 1e-5, 1e-2}, /* all of a sign, far from 0 */
    {"rmsnorm", case_rmsnorm, {33000, 3, -1, 1, 5}, {1000, 3, -1, 1, 5}, 1e-5, 1e-2}, /* over 1024 groups of 32 rows */
    {"rmsnorm", case_rmsnorm, {5, 2000, -1, 1, 6}, {0}, 1e-5, 1e-2},
    {"rope", case_rope, {2, 40, 6, 2, 64, 0}, {2, 9, 6, 2, 16, 0}, 1e-5, 1e-2},
    {"rope", case_rope, {1, 7, 4, 1, 128, 1000}, {0}, 1e-5, 1e-2}, /* from a position > 0 (decoding), hs 128 */
    {"rope", case_rope, {3, 5, 3, 3, 10, 3}, {0}, 1e-5, 1e-2},      /* GPT-2-like heads, hs not a power of 2 */
    {"rope", case_rope, {1, 2, 2, 1, 1024, 7}, {0}, 1e-5, 1e-2},    /* the largest head (512 pairs) */
    {"rope", case_rope, {2, 40, 6, 2, 64, 0, 1}, {2, 9, 6, 2, 16, 0, 1}, 1e-5, 1e-2}, /* packed rows */
    {"swiglu", case_swiglu, {300, 1000}, {7, 100}, 1e-5, 1e-2},
    {"swiglu", case_swiglu, {1, 1}, {0}, 1e-5, 1e-2},
    {"swiglu", case_swiglu, {3, 257}, {0}, 1e-5, 1e-2},
    {"gelu", case_gelu, {1000003}, {1001}, 1e-5, 1e-2},
    {"gelu", case_gelu, {1}, {0}, 1e-5, 1e-2},
    {"add", case_add, {1000003}, {1001}, 1e-7, 1e-2},
    {"add", case_add, {1}, {0}, 1e-7, 1e-2},
    {"sumsq", case_scale_sumsq, {1000003}, {1001}, 1e-7, NO_BF16},
    {"sumsq", case_scale_sumsq, {1}, {0}, 1e-7, NO_BF16},
    {"loss_sum", case_loss_sum, {100003}, {1001}, 0, NO_BF16},
    {"xent", case_xent, {7, 11}, {0}, 1e-5, 1e-2},
    {"xent", case_xent, {64, 50257}, {5, 300}, 1e-5, 1e-2},
    {"xent", case_xent, {1, 1}, {0}, 1e-5, 1e-2},
    {"xent", case_xent, {3, 2}, {0}, 1e-5, 1e-2},
    {"xent", case_xent, {4, 513}, {0}, 1e-5, 1e-2},
    {"xent", case_xent, {4, 513, -1}, {0}, 1e-5, 1e-2}, /* dense rows, 2-byte aligned at bf16 */
    {"xent", case_xent, {3, 100, 101}, {0}, 1e-5, 1e-2}, /* an odd stride */
    {"argmax", case_argmax_special, {0}, {0}, 0, 0},
    {"xent", case_xent_special, {0}, {0}, 0, 0},
    {"rows", case_rows, {6, 40, 9}, {0}, 1e-7, 1e-2},
    {"rows", case_rows, {1, 1, 1}, {0}, 1e-7, 1e-2},
    {"rows", case_rows, {0, 5, 3}, {0}, 1e-7, 1e-2},
    {"adamw", case_adamw, {300007}, {999}, 1e-6, NO_BF16},
    {"adamw", case_adamw, {1}, {0}, 1e-6, NO_BF16},
#define MATMUL(wt)                                                                                                   \
    {"matmul", case_matmul, {37, 29, 53, wt, 1}, {0}, 1e-5, 1e-2}, /* odd sizes: unaligned rows */                     \
    {"matmul", case_matmul, {64, 48, 144, wt, 0}, {0}, 1e-5, 1e-2},                                                   \
    {"matmul", case_matmul, {130, 70, 6, wt, 2}, {0}, 1e-5, 1e-2},                                                    \
    {"matmul", case_matmul, {1, 1, 1, wt, 1}, {0}, 1e-5, 1e-2},                                                       \
    {"matmul", case_matmul, {1, 7, 3, wt, 2}, {0}, 1e-5, 1e-2},                                                       \
    {"matmul", case_matmul, {5, 1, 9, wt, 1}, {0}, 1e-5, 1e-2},                                                       \
    {"matmul", case_matmul, {3, 9, 1, wt, 2}, {0}, 1e-5, 1e-2},                                                       \
    {"matmul", case_matmul, {37, 29, 53, wt, 0, 64}, {0}, 1e-5, 1e-2}, /* rows of out and dout padded */     \
    {"matmul", case_matmul, {64, 48, 300, wt, 0, 384}, {0}, 1e-5, 1e-2}, /* as the logits' (logits_stride) */ \
    {"matmul", case_matmul, {1024, 768, 2304, wt, !(wt)}, {-1}, 1e-5, 1e-2}
    MATMUL(0),
    MATMUL(1),
#undef MATMUL
    {"matmul", case_matmul_cancel, {0}, {0}, 1e-5, 1e-2},
    {"lora", case_lora, {64, 48, 40, 8, 0, 0}, {0}, 1e-5, 1e-2},          /* a whole product's output */
    {"lora", case_lora, {37, 24, 8, 4, 40, 24}, {0}, 1e-5, 1e-2},         /* k of [q | k | v] (24 + 8 + 8) */
    /* model.lora.base_dtype bf16: M K N w_trans bias ldo pieces (bf16 products only) */
    {"matmul16", case_matmul16, {64, 48, 144, 0, 1, 0, 0}, {0}, BF16_ONLY, 1e-2},
    {"matmul16", case_matmul16, {37, 29, 53, 1, 0, 0, 0}, {0}, BF16_ONLY, 1e-2},
    {"matmul16", case_matmul16, {64, 48, 300, 1, 0, 384, 0}, {0}, BF16_ONLY, 1e-2}, /* a padded head's rows */
    {"matmul16", case_matmul16, {40, 64, 1000, 1, 0, 1024, 64 * 96}, {0}, BF16_ONLY, 1e-2}, /* the CPU's pieces */
    {"matmul16", case_matmul16, {40, 64, 1000, 0, 1, 0, 64 * 96}, {0}, BF16_ONLY, 1e-2},
    {"encoder16", case_encoder16, {3, 64, 96, 50, 0, 0}, {3, 17, 24, 50, 0, 0}, BF16_ONLY, 1e-2},
    {"encoder16", case_encoder16, {2, 40, 64, 30, 1, 1}, {0}, BF16_ONLY, 1e-2}, /* no wpe, packed rows */
    {"encoder16", case_encoder16, {3, 24, 32, 50, 0, 0, 25, 17}, {0}, BF16_ONLY, 1e-2}, /* a share of the rows */
    /* arch rank base16 V L C T B num_labels */
    {"lora_model", case_lora_model, {0, 4, 0, 67, 2, 32, 16, 3, 0}, {0}, 1e-4, 5e-2},
    {"lora_model", case_lora_model, {0, 4, 1, 67, 2, 32, 16, 3, 0}, {0}, BF16_ONLY, 5e-2},
    {"lora_model", case_lora_model, {0, 2, 1, 50, 1, 36, 9, 2, 3}, {0}, BF16_ONLY, 5e-2}, /* classifier, odd C */
    {"lora_model", case_lora_model, {1, 4, 1, 67, 2, 48, 16, 3, 0}, {0}, BF16_ONLY, 5e-2},
    {"lora_model", case_lora_model, {1, 4, 0, 67, 2, 48, 16, 3, 0}, {0}, 1e-4, 5e-2},
    {"lora", case_lora, {512, 576, 192, 16, 960, 576}, {64, 96, 32, 8, 160, 96}, 1e-5, 1e-2}, /* SmolLM2's v */
    {"matmul_gelu", case_matmul_gelu, {64, 48, 144, 1}, {0}, 1e-5, 1e-2},   /* both epilogues (aux ld 144, 48) */
    {"matmul_gelu", case_matmul_gelu, {37, 29, 56, 1}, {0}, 1e-5, 1e-2},    /* GELU; no DGELU (aux ld 29) */
    {"matmul_gelu", case_matmul_gelu, {5, 16, 9, 0}, {0}, 1e-5, 1e-2},      /* DGELU; no GELU (aux ld 9) */
    {"matmul_gelu", case_matmul_gelu, {300, 128, 512, 1}, {20, 64, 64, 1}, 1e-5, 1e-2},
    /* attention: B T NH NKV hs (GPT-2: NKV = NH) */
    {"attention", case_attention, {2, 80, 4, 4, 32}, {2, 13, 4, 4, 8}, 1e-5, 1e-2},
    {"attention", case_attention, {1, 1, 2, 2, 2}, {0}, 1e-5, 1e-2},
    {"attention", case_attention, {2, 33, 3, 3, 2}, {0}, 1e-5, 1e-2},
    {"attention", case_attention, {1, 40, 5, 5, 1}, {0}, 1e-5, 1e-2}, /* head size 1 */
    {"attention", case_attention, {3, 70, 1, 1, 12}, {0}, 1e-5, 1e-2},
    /* head size 64 as GPT-2's, past two 128-row tiles with a partial one (cuDNN's plans) */
    {"attention", case_attention, {2, 300, 4, 4, 64}, {1, 64, 2, 2, 64}, 1e-5, 1e-2},
    /* grouped-query attention: 3 and 4 query heads a key/value head, head sizes that cuDNN
     * plans (16, 40, 64) and that it refuses (12: our kernels), none of them C/NH of a model */
    {"attention", case_attention, {2, 70, 6, 2, 16}, {2, 13, 6, 2, 16}, 1e-5, 1e-2},
    {"attention", case_attention, {2, 45, 4, 1, 40}, {1, 21, 4, 1, 40}, 1e-5, 1e-2},
    {"attention", case_attention, {2, 70, 6, 2, 16, 1}, {2, 13, 6, 2, 16, 1}, 1e-5, 1e-2}, /* packed rows (GQA) */
    {"attention", case_attention, {3, 64, 4, 4, 32, 1}, {0}, 1e-5, 1e-2},                   /* packed, cuDNN's size */
    {"attention", case_attention, {2, 33, 6, 2, 12}, {1, 17, 6, 2, 12}, 1e-5, 1e-2},
    {"attention", case_attention, {1, 130, 4, 1, 64}, {-1}, 1e-5, 1e-2}, /* past a 128-row tile */
    {"attention", case_attention, {1, 9, 4, 2, 136}, {0}, 1e-5, 1e-2}, /* over cuDNN's 128 (Hopper's 256) */
    /* attention_cached: T NH NKV hs split */
    {"attention_cached", case_attention_cached, {90, 4, 4, 32, 57}, {13, 4, 4, 8, 6}, 1e-5, 1e-2},
    {"attention_cached", case_attention_cached, {1, 2, 2, 2, 0}, {0}, 1e-5, 1e-2},
    {"attention_cached", case_attention_cached, {40, 5, 5, 1, 39}, {0}, 1e-5, 1e-2}, /* head size 1 */
    {"attention_cached", case_attention_cached, {50, 6, 2, 24, 31}, {13, 6, 2, 8, 6}, 1e-5, 1e-2}, /* GQA */
    {"attention_cached", case_attention_cached, {20, 4, 1, 12, 1}, {0}, 1e-5, 1e-2},                /* one kv head */
    {"model", case_model, {67, 2, 4, 32, 16, 3, 0}, {0}, 1e-4, 5e-2},
    {"model", case_model, {260, 2, 4, 32, 16, 3, 2}, {0}, 1e-4, 5e-2},
    {"model", case_model, {7, 1, 2, 6, 5, 2, 0}, {0}, 1e-4, 5e-2},
    {"model", case_model, {11, 1, 3, 12, 9, 3, 3}, {0}, 1e-4, 5e-2},
    {"model", case_model, {50, 2, 4, 36, 33, 2, 0}, {0}, 1e-4, 5e-2},
    {"model", case_model, {30, 1, 1, 8, 1, 1, 0}, {0}, 1e-4, 5e-2}, /* one token */
    {"model", case_model, {300, 1, 2, 16, 8, 2, 0}, {0}, 1e-4, 5e-2}, /* a padded head of 2 x 128 + 44 rows */
    /* Llama: V L NH NKV C hs I T B flags (1 tied head, 2 attention biases, 4 classifier) */
    {"llama", case_llama, {67, 2, 6, 2, 48, 16, 40, 16, 3, 0}, {0}, 1e-4, 5e-2}, /* GQA, hs = C/NH: fused */
    {"llama", case_llama, {50, 2, 4, 1, 20, 8, 36, 11, 2, 3}, {0}, 1e-4, 5e-2}, /* one kv head, hs != C/NH */
    {"llama", case_llama, {40, 1, 4, 2, 16, 6, 24, 9, 3, 4}, {0}, 1e-4, 5e-2},  /* classifier, hs 6: our kernels */
    {"training", case_training, {4}, {0}, 1e-5, 5e-3},
    {"launches", case_launches, {12}, {0}, 0, 0}, /* GPT-2 124M's 12 layers */
    {"memory", case_memory, {2, 4, 128, 512, 2}, {0}, 0, 0}, /* T x T fp32 probabilities: 8 MiB a layer */
    {"memory", case_memory, {2, 6, 96, 512, 2, 2, 24, 200}, {0}, 0, 0}, /* Llama: GQA, hs 24 != C/NH, SwiGLU */
    {"memory", case_memory, {2, 6, 96, 512, 2, 2, 24, 200, 1}, {0}, 0, 0}, /* the same, packed rows: their mask */
    {"memory", case_memory, {2, 4, 64, 256, 2, 1, 12, 100}, {0}, 0, 0}, /* hs 12: never fused, the estimate knows */
    {"memory", case_memory, {1, 4, 64, 128, 2, 2, 136, 100}, {0}, 0, 0}, /* hs 136: Hopper's cuDNN, not the mock's */
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* --op NAME[,NAME...]: is `op` selected (NULL: all)? */
static int selected(const char *filter, const char *op) {
    if (!filter) return 1;
    size_t n = strlen(op);
    for (const char *p = filter; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len == n && strncmp(p, op, n) == 0) return 1;
        p += len + (e != NULL);
    }
    return 0;
}

/* every name in the filter names an op of the table */
static int filter_ok(const char *filter) {
    for (const char *p = filter; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int known = 0;
        for (int i = 0; i < N_CASES && !known; i++) known = strlen(cases[i].op) == len && !strncmp(p, cases[i].op, len);
        if (!known) {
            fprintf(stderr, "test_ops_backends: --op: no op \"%.*s\" (--list names them)\n", (int)len, p);
            return 0;
        }
        p += len + (e != NULL);
    }
    return 1;
}

/* The selected cases on the open device backend, at its precision; returns how many ran. */
static int run_cases(const char *filter, int bf16) {
    int ran = 0;
    for (int i = 0; i < N_CASES; i++) {
        const op_case *k = &cases[i];
        if (!selected(filter, k->op) || (bf16 && k->tol16 == NO_BF16) || (!bf16 && k->tol32 == BF16_ONLY)) continue;
        const int *shape = g_quick && k->quick[0] ? k->quick : k->full;
        if (shape[0] < 0) continue; /* full runs only */
        k->run(shape, bf16 ? k->tol16 : k->tol32);
        ran++;
    }
    return ran;
}

int main(int argc, char **argv) {
    const char *filter = NULL;
    /* a line at a time: under compute-sanitizer, whose reports go to stderr, the log then shows
     * which case it stopped in (block-buffered, the cases printed up to the exit came after) */
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) g_quick = 1;
        else if (strcmp(argv[i], "--op") == 0 && i + 1 < argc) filter = argv[++i];
        else if (strcmp(argv[i], "--list") == 0) {
            for (int k = 0; k < N_CASES; k++)
                if (k == 0 || strcmp(cases[k].op, cases[k - 1].op) != 0) printf("%s\n", cases[k].op);
            return 0;
        } else {
            fprintf(stderr, "usage: test_ops_backends [--quick] [--op NAME[,NAME...]] [--list]\n");
            return 2;
        }
    }
    if (filter && !filter_ok(filter)) return 2;
    dt_backend_cfg ref_cfg = {.threads = 0};
    CHECK_OK(dt_backend_open(DT_DEVICE_CPU, &ref_cfg, &g_ref));
    int tested = 0;
    for (int kind = DT_DEVICE_CPU + 1; kind <= DT_DEVICE_CUDA; kind++) {
        const dt_ops *ops = dt_backend_ops((dt_device_kind)kind);
        if (!ops || dt_backend_count((dt_device_kind)kind) == 0) {
            const char *vis = getenv("CUDA_VISIBLE_DEVICES");
            printf("%s: %s%s%s%s: skipped\n", dt_device_name((dt_device_kind)kind),
                   ops ? "no device visible to dtrain (it counts /proc/driver/nvidia/gpus, else /dev/nvidia0, ...)"
                       : "backend not built",
                   ops && vis ? " with CUDA_VISIBLE_DEVICES=\"" : "", ops && vis ? vis : "", ops && vis ? "\"" : "");
            continue;
        }
        for (int bf16 = 0; bf16 < 2; bf16++) {
            dt_backend_cfg cfg = {.device = 0, .precision = bf16, .rank = 0};
            dt_status st = dt_backend_open((dt_device_kind)kind, &cfg, &g_dev);
            if (st == DT_ERR_CONFIG && bf16) { /* a device without bf16 products */
                printf("%s, bf16 products: skipped: %s\n", ops->name, dt_error_msg());
                continue;
            }
            if (st != DT_OK) {
                fprintf(stderr, "%s\n", dt_error_msg());
                return 1;
            }
            g_act = ops->act_dtype(ops->bf16(g_dev->ctx));
            printf("%s, %s%s:\n", ops->name, bf16 ? "bf16 products" : "fp32", g_quick ? " (quick)" : "");
            tested += run_cases(filter, bf16);
            dt_backend_close(g_dev);
            g_dev = NULL;
        }
    }
    dt_backend_close(g_ref);
    if (!tested) {
        printf("test_ops_backends: no case ran on a non-CPU backend: skipped\n");
        return 77;
    }
    if (g_failures) {
        fprintf(stderr, "test_ops_backends: %d comparison(s) failed\n", g_failures);
        return 1;
    }
    printf("test_ops_backends: %d cases, all ops match the CPU backend\n", tested);
    return 0;
}
