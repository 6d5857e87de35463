/* mock_att.c — src/ops/cudnn_att.h on the CPU: cuDNN's fused SDPA (flash attention) as a
 * reference, linked into the mock programs test_ops_backends_fused and dtrain_fused in place of
 * cudnn_att.cpp (the Makefile puts this object before libdt.a, so the archive's cudnn_att.o is
 * never pulled). With it the CUDA backend's fused attention path (src/ops/ops_cuda.c: att_fused,
 * fused_fwd, fused_bwd: the bf16 buffers and statistics it passes, the workspace slot, the
 * memory sizing, the stream order) runs on the mock GPU; the plain programs keep the real
 * cudnn_att.cpp, whose cuDNN (mock_cudnn.c) cannot make a handle.
 *
 * Modelled, and checked:
 *   - dtc_att_open: always a handle on the given stream (MOCK_ATT_OPEN_FAIL=1: NULL, as where
 *     cuDNN cannot be loaded); dtc_att_close waits for the device (cudnnDestroy synchronises)
 *     and accepts NULL; a handle used after its close, or not made by dtc_att_open, is reported.
 *   - dtc_att_plan refuses what cuDNN's SDPA cannot run: a head size that is not a multiple of
 *     8 or is over 128 (and empty shapes), with a reason, so the backend's fallback to its own
 *     kernels is exercised too; otherwise *ws = B*NH*(T64*T128*2 + T*4) bytes, T64 and T128 T
 *     rounded up to multiples of 64 and 128 (the deterministic backward's dP in 16 bits and the
 *     softmax sums, as the cuDNN frontend sizes them on Hopper, and what ops_cuda.c's estimate
 *     assumes, so test_ops_backends' memory case agrees; MOCK_ATT_WS_BYTES=N: N instead, e.g.
 *     0, with which that case reports the difference).
 *   - dtc_att_fwd / dtc_att_bwd, queued as stream work on the handle's stream (mock_api.h's
 *     mock_enqueue_fn), so they run after the work queued before them (what wrote qkv, dout)
 *     and before the work queued after (what reads out, dqkv), as cuDNN's kernels would:
 *       forward: S = scale Q K^T (scale 1/sqrtf(HS), as cudnn_att.cpp passes it), causal;
 *       stats = max + log(sum exp) per row (natural log, fp32), O = softmax(S) V rounded to
 *       bf16 (round to nearest even); computed in double from the bf16 operands;
 *       backward: P recomputed from the given stats, D_i = dO_i . O_i (the given O), dS =
 *       P * (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO, in double, rounded
 *       to bf16 into every column of dqkv (overwritten). Deterministic (a fixed order).
 *     Arguments are checked as the interface states them: every buffer non-NULL, device (or
 *     managed) memory, inside one allocation for the whole (B,T,3C), (B,T,C) or (B,NH,T) shape;
 *     bf16 buffers 16-byte aligned and stats 4-byte aligned (an assumption: cuDNN's kernels
 *     load 16 bytes at a time); outputs that overlap an input; a workspace smaller than the
 *     plan's or not inside a device allocation of ws_bytes. Backward also recomputes forward
 *     from qkv: statistics or an output that are not forward's for these qkv (a buffer
 *     overwritten between the passes, a wrong pointer) are reported, where cuDNN would
 *     silently give wrong gradients.
 *   - MOCK_ATT_TRACE=1 prints every plan, forward and backward.
 * Every problem is printed as "MOCK ERROR: cuDNN attention ..." (mock_report) and makes the
 * process exit 1; misuse also returns -1 with the reason in why.
 *
 * Not modelled: cuDNN itself (versions, handles, the frontend's graphs, plan building and its
 * failures beyond the head size rule above, e.g. sequence lengths or GPUs a real cuDNN
 * refuses), real workspace sizes (a real plan may need none), the GPU's arithmetic (fp32
 * accumulation in tiles, P rounded to bf16 before P V, exp2 with a folded scale): results here
 * are closer to exact than cuDNN's, so tolerances tuned here may be tight for a GPU; dropout,
 * padding masks, other layouts and data types; the timing of a fused kernel. */
#define _GNU_SOURCE
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "cudnn_att.h"
#include "mock_api.h"

#define MAGIC 0x6d617474u /* "matt" */

struct dtc_att {
    unsigned magic;
    int closed;
    cudaStream_t s;
    unsigned long calls; /* forward and backward calls, for messages */
    struct dtc_att *next;
};

static pthread_mutex_t handles_mu = PTHREAD_MUTEX_INITIALIZER;
static struct dtc_att *handles; /* every handle made (never released: use after close is found) */

static void say(char *why, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *why, size_t n, const char *fmt, ...) {
    if (!why || !n) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, n, fmt, ap);
    va_end(ap);
}

static int trace(void) {
    const char *e = getenv("MOCK_ATT_TRACE");
    return e && *e && strcmp(e, "0") != 0;
}

/* a, if it is a live handle made here; else reported, NULL */
static dtc_att *live(const dtc_att *a, const char *call, char *why, size_t n) {
    dtc_att *h = NULL;
    pthread_mutex_lock(&handles_mu);
    for (dtc_att *k = handles; k; k = k->next)
        if (k == a) h = k;
    pthread_mutex_unlock(&handles_mu);
    if (!h || h->magic != MAGIC) {
        mock_report("cuDNN attention: %s: %p is not a handle made by dtc_att_open", call, (const void *)a);
        say(why, n, "mock cuDNN: %s: not a handle", call);
        return NULL;
    }
    if (__atomic_load_n(&h->closed, __ATOMIC_SEQ_CST)) {
        mock_report("cuDNN attention: %s: handle %p was closed (use after dtc_att_close)", call, (const void *)a);
        say(why, n, "mock cuDNN: %s: closed handle", call);
        return NULL;
    }
    return h;
}

/* ---------------------------------------------------------------- bf16 */

static double bf(uint16_t v) {
    uint32_t u = (uint32_t)v << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* x rounded to bf16, to nearest even, in one rounding (not through float's) */
static uint16_t to_bf16(double x) {
    float f = (float)x;
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x0040); /* quiet, sign kept */
    if (isinf(f)) return (uint16_t)(u >> 16);
    uint32_t lo = u & 0xffff0000u, rest = u & 0xffffu;
    uint16_t down = (uint16_t)(lo >> 16), up = (uint16_t)((lo >> 16) + 1); /* toward zero, away from zero */
    if (rest < 0x8000u) return down;
    if (rest > 0x8000u) return up;
    /* f is halfway: x itself decides (float's rounding of x may have made the tie) */
    const double ax = fabs(x), af = fabs((double)f);
    if (ax > af) return up;
    if (ax < af) return down;
    return (down & 1) ? up : down;
}

/* ---------------------------------------------------------------- shapes */

/* 0 when cuDNN's SDPA would plan the shape; else -1 and why */
static int refuse(int B, int T, int NH, int HS, char *why, size_t n) {
    if (B <= 0 || T <= 0 || NH <= 0 || HS <= 0) {
        say(why, n, "mock cuDNN: an empty shape (B %d, T %d, NH %d, head size %d)", B, T, NH, HS);
        return -1;
    }
    if (HS % 8) {
        say(why, n, "mock cuDNN: head size %d is not a multiple of 8", HS);
        return -1;
    }
    if (HS > 128) {
        say(why, n, "mock cuDNN: head size %d is over 128", HS);
        return -1;
    }
    return 0;
}

static size_t ws_need(int B, int T, int NH, int HS, int backward) {
    const char *e = getenv("MOCK_ATT_WS_BYTES");
    if (e && *e) return (size_t)strtoull(e, NULL, 10);
    (void)HS;
    const size_t t64 = ((size_t)T + 63) / 64 * 64, t128 = ((size_t)T + 127) / 128 * 128;
    const size_t sums = (size_t)B * (size_t)NH * (size_t)T * sizeof(float);
    return backward ? (size_t)B * (size_t)NH * t64 * t128 * 2 + sums : sums;
}

/* ---------------------------------------------------------------- the API */

dtc_att *dtc_att_open(cudaStream_t s, char *why, size_t n) {
    const char *f = getenv("MOCK_ATT_OPEN_FAIL");
    if (f && strcmp(f, "1") == 0) {
        say(why, n, "mock cuDNN: MOCK_ATT_OPEN_FAIL");
        return NULL;
    }
    dtc_att *a = calloc(1, sizeof *a);
    if (!a) {
        say(why, n, "mock cuDNN: out of memory");
        return NULL;
    }
    a->magic = MAGIC;
    a->s = s;
    pthread_mutex_lock(&handles_mu);
    a->next = handles;
    handles = a;
    pthread_mutex_unlock(&handles_mu);
    return a;
}

void dtc_att_close(dtc_att *a) {
    if (!a) return;
    if (!live(a, "dtc_att_close", NULL, 0)) return;
    cudaDeviceSynchronize(); /* cudnnDestroy synchronises the device: queued attention finishes */
    __atomic_store_n(&a->closed, 1, __ATOMIC_SEQ_CST);
}

int dtc_att_plan(dtc_att *a, int B, int T, int NH, int HS, int backward, size_t *ws, char *why, size_t n) {
    if (!live(a, "dtc_att_plan", why, n)) return -1;
    if (!ws) {
        mock_report("cuDNN attention: dtc_att_plan: NULL ws");
        say(why, n, "mock cuDNN: NULL ws");
        return -1;
    }
    if (refuse(B, T, NH, HS, why, n)) {
        if (trace()) fprintf(stderr, "MOCK ATT: plan B %d T %d NH %d HS %d refused: %s\n", B, T, NH, HS, why ? why : "");
        return -1;
    }
    *ws = ws_need(B, T, NH, HS, backward);
    if (trace())
        fprintf(stderr, "MOCK ATT: plan B %d T %d NH %d HS %d%s: workspace %zu bytes\n", B, T, NH, HS,
                backward ? ", forward and backward" : ", forward only", *ws);
    return 0;
}

/* ---------------------------------------------------------------- argument checks */

typedef struct span { const void *p; size_t bytes; const char *name; } span;

static int overlap(span x, span y) {
    const char *a = x.p, *b = y.p;
    return x.bytes && y.bytes && a < b + y.bytes && b < a + x.bytes;
}

/* buffer p: non-NULL, inside one device allocation for `bytes`, aligned; 0 or reported */
static int check_buf(const char *call, unsigned long k, span s, size_t align) {
    char what[160];
    snprintf(what, sizeof what, "cuDNN attention %s #%lu: %s", call, k, s.name);
    if (!s.p) {
        mock_report("%s: NULL", what);
        return 1;
    }
    if (mock_check_dev_range(s.p, s.bytes, what)) return 1;
    if ((uintptr_t)s.p % align) {
        mock_report("%s: %p is not %zu-byte aligned", what, s.p, align);
        return 1;
    }
    return 0;
}

/* the shape, the workspace, the buffers: 0, or -1 with why (and misuse reported) */
static int check_call(const char *call, unsigned long k, int B, int T, int NH, int HS, void *ws, size_t ws_bytes,
                      const span *in, int n_in, const span *out, int n_out, char *why, size_t n) {
    if (refuse(B, T, NH, HS, why, n)) return -1; /* the real one plans first, and fails so */
    const size_t need = ws_need(B, T, NH, HS, strcmp(call, "backward") == 0);
    if (ws_bytes < need) {
        mock_report("cuDNN attention %s #%lu: the workspace has %zu bytes, B %d T %d NH %d HS %d needs %zu", call, k,
                    ws_bytes, B, T, NH, HS, need);
        say(why, n, "mock cuDNN: the workspace has %zu bytes, the shape needs %zu", ws_bytes, need);
        return -1;
    }
    int bad = 0;
    if (need || ws) { /* cuDNN accepts a NULL workspace only where the plan needs none */
        char what[160];
        snprintf(what, sizeof what, "cuDNN attention %s #%lu: workspace (%zu bytes)", call, k, ws_bytes);
        if (!ws) {
            mock_report("%s: NULL", what);
            bad = 1;
        } else bad |= mock_check_dev_range(ws, ws_bytes ? ws_bytes : 1, what);
    }
    for (int i = 0; i < n_in; i++) bad |= check_buf(call, k, in[i], strcmp(in[i].name, "stats") ? 16 : 4);
    for (int i = 0; i < n_out; i++) bad |= check_buf(call, k, out[i], strcmp(out[i].name, "stats") ? 16 : 4);
    for (int i = 0; i < n_out && !bad; i++) {
        for (int j = 0; j < n_in; j++)
            if (overlap(out[i], in[j])) {
                mock_report("cuDNN attention %s #%lu: output %s overlaps input %s", call, k, out[i].name, in[j].name);
                bad = 1;
            }
        for (int j = i + 1; j < n_out; j++)
            if (overlap(out[i], out[j])) {
                mock_report("cuDNN attention %s #%lu: outputs %s and %s overlap", call, k, out[i].name, out[j].name);
                bad = 1;
            }
        if (ws && overlap(out[i], (span){ws, ws_bytes, "workspace"})) {
            mock_report("cuDNN attention %s #%lu: output %s overlaps the workspace", call, k, out[i].name);
            bad = 1;
        }
    }
    if (bad) {
        say(why, n, "mock cuDNN: bad arguments to %s (MOCK ERROR above)", call);
        return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the work, on the stream */

typedef struct job {
    int bwd;
    unsigned long k;
    int B, T, NH, HS;
    float scale;
    const uint16_t *qkv, *out_in, *dout;
    const float *stats_in;
    uint16_t *out, *dqkv;
    float *stats;
} job;

/* head h of batch b: rows of (B,T,width) at column col */
static void load(double *dst, const uint16_t *src, int b, int T, int HS, size_t width, size_t col) {
    for (int t = 0; t < T; t++) {
        const uint16_t *r = src + ((size_t)b * T + t) * width + col;
        for (int d = 0; d < HS; d++) dst[(size_t)t * HS + d] = bf(r[d]);
    }
}
static void store(uint16_t *dst, const double *src, int b, int T, int HS, size_t width, size_t col) {
    for (int t = 0; t < T; t++) {
        uint16_t *r = dst + ((size_t)b * T + t) * width + col;
        for (int d = 0; d < HS; d++) r[d] = to_bf16(src[(size_t)t * HS + d]);
    }
}
static double dot(const double *x, const double *y, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}

/* equal, or both NaN (a diverged run's NaNs are forward's too) */
static int same(double x, double y) { return x == y || (isnan(x) && isnan(y)); }

/* row t's scores (keys 0..t) into s, their log-sum-exp returned */
static double scores(double *s, const double *Q, const double *K, int t, int HS, double scale) {
    double m = -INFINITY, l = 0;
    for (int j = 0; j <= t; j++) {
        s[j] = scale * dot(Q + (size_t)t * HS, K + (size_t)j * HS, HS);
        if (s[j] > m) m = s[j];
    }
    for (int j = 0; j <= t; j++) l += exp(s[j] - m);
    return m + log(l);
}

static void run_job(void *arg) {
    job *j = arg;
    const int B = j->B, T = j->T, NH = j->NH, HS = j->HS;
    const size_t C = (size_t)NH * HS, C3 = 3 * C, th = (size_t)T * HS;
    const double scale = j->scale;
    double *Q = malloc(th * sizeof(double)), *K = malloc(th * sizeof(double)), *V = malloc(th * sizeof(double));
    double *O = malloc(th * sizeof(double)), *dO = malloc(th * sizeof(double)), *s = malloc((size_t)T * sizeof(double));
    double *dQ = calloc(th, sizeof(double)), *dK = calloc(th, sizeof(double)), *dV = calloc(th, sizeof(double));
    double *D = malloc((size_t)T * sizeof(double)), *orow = malloc((size_t)HS * sizeof(double));
    if (!Q || !K || !V || !O || !dO || !s || !dQ || !dK || !dV || !D || !orow) {
        fprintf(stderr, "MOCK: cuDNN attention: out of host memory\n");
        abort();
    }
    size_t bad_stats = 0, bad_out = 0;
    double worst_stats = 0, worst_out = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const size_t bh = (size_t)b * NH + h;
            load(Q, j->qkv, b, T, HS, C3, (size_t)h * HS);
            load(K, j->qkv, b, T, HS, C3, C + (size_t)h * HS);
            load(V, j->qkv, b, T, HS, C3, 2 * C + (size_t)h * HS);
            if (!j->bwd) {
                for (int t = 0; t < T; t++) {
                    const double lse = scores(s, Q, K, t, HS, scale);
                    for (int d = 0; d < HS; d++) O[(size_t)t * HS + d] = 0;
                    for (int u = 0; u <= t; u++) {
                        const double p = exp(s[u] - lse);
                        for (int d = 0; d < HS; d++) O[(size_t)t * HS + d] += p * V[(size_t)u * HS + d];
                    }
                    j->stats[bh * T + t] = (float)lse;
                }
                store(j->out, O, b, T, HS, C, (size_t)h * HS);
                continue;
            }
            load(O, j->out_in, b, T, HS, C, (size_t)h * HS);
            load(dO, j->dout, b, T, HS, C, (size_t)h * HS);
            memset(dQ, 0, th * sizeof(double));
            memset(dK, 0, th * sizeof(double));
            memset(dV, 0, th * sizeof(double));
            for (int t = 0; t < T; t++) {
                const double *dOt = dO + (size_t)t * HS, *Ot = O + (size_t)t * HS;
                D[t] = dot(dOt, Ot, HS);
                /* forward again, from qkv: are stats and out forward's? */
                const double lse = scores(s, Q, K, t, HS, scale), given = j->stats_in[bh * T + t];
                const double es = fabs(lse - given);
                if (!(es <= 1e-5 * (1 + fabs(lse))) && !same(lse, given)) {
                    bad_stats++;
                    if (!(es <= worst_stats)) worst_stats = es;
                }
                for (int d = 0; d < HS; d++) orow[d] = 0;
                for (int u = 0; u <= t; u++) {
                    const double p = exp(s[u] - lse);
                    for (int d = 0; d < HS; d++) orow[d] += p * V[(size_t)u * HS + d];
                }
                for (int d = 0; d < HS; d++) {
                    /* out as forward rounded it, within bf16's half ulp (2^-9 relative) and a margin */
                    const double eo = fabs(orow[d] - Ot[d]);
                    if (!(eo <= 4.0 / 512 * fabs(orow[d]) + 1e-6) && !same(orow[d], Ot[d])) {
                        bad_out++;
                        if (!(eo <= worst_out)) worst_out = eo;
                    }
                }
                /* backward from the given statistics */
                for (int u = 0; u <= t; u++) {
                    const double *Ku = K + (size_t)u * HS, *Vu = V + (size_t)u * HS, *Qt = Q + (size_t)t * HS;
                    const double p = exp(s[u] - given), dp = dot(dOt, Vu, HS), ds = p * (dp - D[t]);
                    double *dQt = dQ + (size_t)t * HS, *dKu = dK + (size_t)u * HS, *dVu = dV + (size_t)u * HS;
                    for (int d = 0; d < HS; d++) {
                        dQt[d] += scale * ds * Ku[d];
                        dKu[d] += scale * ds * Qt[d];
                        dVu[d] += p * dOt[d];
                    }
                }
            }
            store(j->dqkv, dQ, b, T, HS, C3, (size_t)h * HS);
            store(j->dqkv, dK, b, T, HS, C3, C + (size_t)h * HS);
            store(j->dqkv, dV, b, T, HS, C3, 2 * C + (size_t)h * HS);
        }
    if (bad_stats)
        mock_report("cuDNN attention backward #%lu (B %d T %d NH %d HS %d): %zu of %zu statistics are not forward's "
                    "log-sum-exp for these qkv (worst off by %g): stats overwritten or the wrong buffer?",
                    j->k, B, T, NH, HS, bad_stats, (size_t)B * NH * T, worst_stats);
    if (bad_out)
        mock_report("cuDNN attention backward #%lu (B %d T %d NH %d HS %d): %zu of %zu elements of out are not "
                    "forward's output for these qkv (worst off by %g): out overwritten, or not rounded from bf16?",
                    j->k, B, T, NH, HS, bad_out, (size_t)B * T * C, worst_out);
    free(Q), free(K), free(V), free(O), free(dO), free(s), free(dQ), free(dK), free(dV), free(D), free(orow);
    free(j);
}

static int enqueue(dtc_att *a, job *tmpl, char *why, size_t n) {
    job *j = malloc(sizeof *j);
    if (!j) {
        say(why, n, "mock cuDNN: out of memory");
        return -1;
    }
    *j = *tmpl;
    mock_enqueue_fn((void *)a->s, tmpl->bwd ? "cudnn_sdpa_bwd" : "cudnn_sdpa_fwd", run_job, j);
    return 0;
}

int dtc_att_fwd(dtc_att *a, void *out, float *stats, const void *qkv, int B, int T, int NH, int HS, void *ws,
                size_t ws_bytes, char *why, size_t n) {
    if (!live(a, "dtc_att_fwd", why, n)) return -1;
    const unsigned long k = __atomic_add_fetch(&a->calls, 1, __ATOMIC_SEQ_CST);
    const size_t btc = (size_t)B * T * NH * HS;
    if (trace())
        fprintf(stderr, "MOCK ATT: forward #%lu B %d T %d NH %d HS %d qkv %p out %p stats %p ws %p (%zu bytes)\n", k, B,
                T, NH, HS, qkv, out, (void *)stats, ws, ws_bytes);
    const span in[] = {{qkv, 3 * btc * 2, "qkv"}};
    const span outs[] = {{out, btc * 2, "out"}, {stats, (size_t)B * NH * T * sizeof(float), "stats"}};
    if (check_call("forward", k, B, T, NH, HS, ws, ws_bytes, in, 1, outs, 2, why, n)) return -1;
    job j = {.bwd = 0, .k = k, .B = B, .T = T, .NH = NH, .HS = HS, .scale = 1.0f / sqrtf((float)HS), .qkv = qkv,
             .out = out, .stats = stats};
    return enqueue(a, &j, why, n);
}

int dtc_att_bwd(dtc_att *a, void *dqkv, const void *dout, const void *qkv, const void *out, const float *stats, int B,
                int T, int NH, int HS, void *ws, size_t ws_bytes, char *why, size_t n) {
    if (!live(a, "dtc_att_bwd", why, n)) return -1;
    const unsigned long k = __atomic_add_fetch(&a->calls, 1, __ATOMIC_SEQ_CST);
    const size_t btc = (size_t)B * T * NH * HS;
    if (trace())
        fprintf(stderr, "MOCK ATT: backward #%lu B %d T %d NH %d HS %d dqkv %p dout %p qkv %p out %p stats %p ws %p "
                "(%zu bytes)\n", k, B, T, NH, HS, dqkv, dout, qkv, out, (const void *)stats, ws, ws_bytes);
    const span in[] = {{qkv, 3 * btc * 2, "qkv"}, {out, btc * 2, "out"}, {dout, btc * 2, "dout"},
                       {stats, (size_t)B * NH * T * sizeof(float), "stats"}};
    const span outs[] = {{dqkv, 3 * btc * 2, "dqkv"}};
    if (check_call("backward", k, B, T, NH, HS, ws, ws_bytes, in, 4, outs, 1, why, n)) return -1;
    job j = {.bwd = 1, .k = k, .B = B, .T = T, .NH = NH, .HS = HS, .scale = 1.0f / sqrtf((float)HS), .qkv = qkv,
             .out_in = out, .dout = dout, .stats_in = stats, .dqkv = dqkv};
    return enqueue(a, &j, why, n);
}
