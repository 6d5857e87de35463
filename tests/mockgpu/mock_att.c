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
 *     8 or is over 128 (the frontend's rule before Hopper, which takes 256 for some graphs), query
 *     heads that are not a multiple of the key/value heads (and empty shapes), with a reason, so the backend's fallback to its own
 *     kernels is exercised too; otherwise *ws = B*NH*(T64*T128*2 + T*4) bytes, T64 and T128 T
 *     rounded up to multiples of 64 and 128 (the deterministic backward's dP in 16 bits and the
 *     softmax sums, as the cuDNN frontend sizes them on Hopper, and what ops_cuda.c's estimate
 *     assumes, so test_ops_backends' memory case agrees; MOCK_ATT_WS_BYTES=N: N instead, e.g.
 *     0, with which that case reports the difference).
 *   - dtc_att_fwd / dtc_att_bwd, queued as stream work on the handle's stream (mock_api.h's
 *     mock_enqueue_fn), so they run after the work queued before them (what wrote qkv, dout)
 *     and before the work queued after (what reads out, dqkv), as cuDNN's kernels would, with
 *     grouped-query attention as cuDNN's (h_k = h_v = NKV): query head h reads key/value head
 *     g = h / (NH/NKV) at its columns of the packed qkv rows [q (NH) | k (NKV) | v (NKV)];
 *       forward: S = scale Q K^T (scale 1/sqrtf(HS), as cudnn_att.cpp passes it), plus with
 *       packed rows (dtc_shape.packed) the mask's row (bf16, as cuDNN adds its SDPA bias: the
 *       values the backend's kernel wrote, so a wrong mask gives wrong results), causal;
 *       stats = max + log(sum exp) per row (natural log, fp32), O = softmax(S) V rounded to
 *       bf16 (round to nearest even); computed in double from the bf16 operands;
 *       backward: P recomputed from the given stats, D_i = dO_i . O_i (the given O), dS =
 *       P * (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q, dV = P^T dO, in double (dK and
 *       dV summed over the group's query heads in order), rounded once to bf16 into every
 *       column of dqkv (overwritten). Deterministic (a fixed order).
 *     Arguments are checked as the interface states them: every buffer non-NULL, device (or
 *     managed) memory, inside one allocation for the whole (B,T,(NH+2NKV)HS), (B,T,NH*HS) or
 *     (B,NH,T) shape, the mask (B,T,T) bf16 for packed rows and none for others;
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
static int refuse(dtc_shape s, char *why, size_t n) {
    if (s.B <= 0 || s.T <= 0 || s.NH <= 0 || s.NKV <= 0 || s.HS <= 0) {
        say(why, n, "mock cuDNN: an empty shape (B %d, T %d, NH %d, NKV %d, head size %d)", s.B, s.T, s.NH, s.NKV,
            s.HS);
        return -1;
    }
    if (s.NH % s.NKV) {
        say(why, n, "mock cuDNN: %d query heads are not a multiple of %d key/value heads", s.NH, s.NKV);
        return -1;
    }
    if (s.HS % 8) {
        say(why, n, "mock cuDNN: head size %d is not a multiple of 8", s.HS);
        return -1;
    }
    if (s.HS > 128) {
        say(why, n, "mock cuDNN: head size %d is over 128", s.HS);
        return -1;
    }
    return 0;
}

/* the workspace: NH query heads' (grouped key/value heads change nothing, as in the frontend:
 * its full-head dK, dV of GQA are virtual in the fused kernel) */
static size_t ws_need(dtc_shape s, int backward) {
    const char *e = getenv("MOCK_ATT_WS_BYTES");
    if (e && *e) return (size_t)strtoull(e, NULL, 10);
    const size_t t64 = ((size_t)s.T + 63) / 64 * 64, t128 = ((size_t)s.T + 127) / 128 * 128;
    const size_t sums = (size_t)s.B * (size_t)s.NH * (size_t)s.T * sizeof(float);
    return backward ? (size_t)s.B * (size_t)s.NH * t64 * t128 * 2 + sums : sums;
}

/* the bytes of the packed buffers: qkv (and dqkv), out (and dout), stats */
static size_t qkv_bytes(dtc_shape s) { return (size_t)s.B * s.T * ((size_t)s.NH + 2 * (size_t)s.NKV) * s.HS * 2; }
static size_t out_bytes(dtc_shape s) { return (size_t)s.B * s.T * (size_t)s.NH * s.HS * 2; }
static size_t stats_bytes(dtc_shape s) { return (size_t)s.B * s.NH * (size_t)s.T * sizeof(float); }
static size_t mask_bytes(dtc_shape s) { return (size_t)s.B * s.T * (size_t)DTC_MASK_LD(s.T) * 2; } /* packed rows' */

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

int dtc_att_plan(dtc_att *a, dtc_shape s, int backward, size_t *ws, char *why, size_t n) {
    if (!live(a, "dtc_att_plan", why, n)) return -1;
    if (!ws) {
        mock_report("cuDNN attention: dtc_att_plan: NULL ws");
        say(why, n, "mock cuDNN: NULL ws");
        return -1;
    }
    if (refuse(s, why, n)) {
        if (trace())
            fprintf(stderr, "MOCK ATT: plan B %d T %d NH %d NKV %d HS %d refused: %s\n", s.B, s.T, s.NH, s.NKV, s.HS,
                    why ? why : "");
        return -1;
    }
    *ws = ws_need(s, backward);
    if (trace())
        fprintf(stderr, "MOCK ATT: plan B %d T %d NH %d NKV %d HS %d%s%s: workspace %zu bytes\n", s.B, s.T, s.NH,
                s.NKV, s.HS, s.packed ? " packed" : "", backward ? ", forward and backward" : ", forward only", *ws);
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

/* outputs overlapping inputs, each other or the workspace: 0 or reported */
static int check_overlaps(const char *call, unsigned long k, const span *in, int n_in, const span *out, int n_out,
                          void *ws, size_t ws_bytes) {
    int bad = 0;
    for (int i = 0; i < n_out; i++) {
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
    return bad;
}

/* the shape, the workspace, the buffers: 0, or -1 with why (and misuse reported) */
static int check_call(const char *call, unsigned long k, dtc_shape s, void *ws, size_t ws_bytes, const span *in,
                      int n_in, const span *out, int n_out, char *why, size_t n) {
    if (refuse(s, why, n)) return -1; /* the real one plans first, and fails so */
    const size_t need = ws_need(s, strcmp(call, "backward") == 0);
    if (ws_bytes < need) {
        mock_report("cuDNN attention %s #%lu: the workspace has %zu bytes, B %d T %d NH %d NKV %d HS %d needs %zu",
                    call, k, ws_bytes, s.B, s.T, s.NH, s.NKV, s.HS, need);
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
    if (!bad) bad = check_overlaps(call, k, in, n_in, out, n_out, ws, ws_bytes);
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
    dtc_shape s;
    float scale;
    const uint16_t *qkv, *out_in, *dout, *mask;
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

/* row t's scores (keys 0..t) into s, their log-sum-exp returned; mrow: the row of packed rows'
 * mask (bf16, added to the scaled scores as cuDNN's SDPA adds its bias), or NULL */
static double scores(double *s, const double *Q, const double *K, int t, int HS, double scale,
                     const uint16_t *mrow) {
    double m = -INFINITY, l = 0;
    for (int j = 0; j <= t; j++) {
        s[j] = scale * dot(Q + (size_t)t * HS, K + (size_t)j * HS, HS) + (mrow ? bf(mrow[j]) : 0.0);
        if (s[j] > m) m = s[j];
    }
    for (int j = 0; j <= t; j++) l += exp(s[j] - m);
    return m + log(l);
}

/* one query head's work in double: its Q, the K and V of its key/value head, O, dO, the
 * gradients (dQ its own; dK, dV summed over the group), a row of scores and D = rowsum(dO O) */
typedef struct bufs {
    double *Q, *K, *V, *O, *dO, *dQ, *dK, *dV, *s, *D, *orow;
} bufs;

static bufs bufs_new(int T, int HS) {
    const size_t th = (size_t)T * HS;
    bufs w = {malloc(th * sizeof(double)), malloc(th * sizeof(double)), malloc(th * sizeof(double)),
              malloc(th * sizeof(double)), malloc(th * sizeof(double)), calloc(th, sizeof(double)),
              calloc(th, sizeof(double)), calloc(th, sizeof(double)), malloc((size_t)T * sizeof(double)),
              malloc((size_t)T * sizeof(double)), malloc((size_t)HS * sizeof(double))};
    if (!w.Q || !w.K || !w.V || !w.O || !w.dO || !w.dQ || !w.dK || !w.dV || !w.s || !w.D || !w.orow) {
        fprintf(stderr, "MOCK: cuDNN attention: out of host memory\n");
        abort();
    }
    return w;
}

static void bufs_free(bufs *w) {
    free(w->Q), free(w->K), free(w->V), free(w->O), free(w->dO), free(w->dQ), free(w->dK), free(w->dV), free(w->s);
    free(w->D), free(w->orow);
}

/* row t of sequence b of the packed rows' mask, or NULL */
static const uint16_t *mask_row(const job *j, int b, int t) {
    return j->mask ? j->mask + ((size_t)b * j->s.T + t) * DTC_MASK_LD(j->s.T) : NULL;
}

/* forward of query head h of batch b (K, V loaded): out and stats */
static void fwd_head(const job *j, bufs *w, int b, int h) {
    const dtc_shape s = j->s;
    const int T = s.T, HS = s.HS;
    load(w->Q, j->qkv, b, T, HS, ((size_t)s.NH + 2 * (size_t)s.NKV) * HS, (size_t)h * HS);
    for (int t = 0; t < T; t++) {
        const double lse = scores(w->s, w->Q, w->K, t, HS, j->scale, mask_row(j, b, t));
        for (int d = 0; d < HS; d++) w->O[(size_t)t * HS + d] = 0;
        for (int u = 0; u <= t; u++) {
            const double p = exp(w->s[u] - lse);
            for (int d = 0; d < HS; d++) w->O[(size_t)t * HS + d] += p * w->V[(size_t)u * HS + d];
        }
        j->stats[((size_t)b * s.NH + h) * T + t] = (float)lse;
    }
    store(j->out, w->O, b, T, HS, (size_t)s.NH * HS, (size_t)h * HS);
}

/* what backward found of forward's statistics and output: how many differ, the worst */
typedef struct drift {
    size_t stats, out;
    double worst_stats, worst_out;
} drift;

/* forward again for row t (scores into w->s): are the given statistic and out forward's? */
static void check_row(const job *j, bufs *w, size_t bh, int t, drift *dr) {
    const int HS = j->s.HS;
    const double lse = scores(w->s, w->Q, w->K, t, HS, j->scale, mask_row(j, (int)(bh / j->s.NH), t));
    const double given = j->stats_in[bh * j->s.T + t];
    const double es = fabs(lse - given);
    if (!(es <= 1e-5 * (1 + fabs(lse))) && !same(lse, given)) {
        dr->stats++;
        if (!(es <= dr->worst_stats)) dr->worst_stats = es;
    }
    for (int d = 0; d < HS; d++) w->orow[d] = 0;
    for (int u = 0; u <= t; u++) {
        const double p = exp(w->s[u] - lse);
        for (int d = 0; d < HS; d++) w->orow[d] += p * w->V[(size_t)u * HS + d];
    }
    const double *Ot = w->O + (size_t)t * HS;
    for (int d = 0; d < HS; d++) {
        /* out as forward rounded it, within bf16's half ulp (2^-9 relative) and a margin */
        const double eo = fabs(w->orow[d] - Ot[d]);
        if (!(eo <= 4.0 / 512 * fabs(w->orow[d]) + 1e-6) && !same(w->orow[d], Ot[d])) {
            dr->out++;
            if (!(eo <= dr->worst_out)) dr->worst_out = eo;
        }
    }
}

/* backward of query head h of batch b (K, V loaded; dK, dV accumulate the group's heads): dQ */
static void bwd_head(const job *j, bufs *w, int b, int h, drift *dr) {
    const dtc_shape s = j->s;
    const int T = s.T, HS = s.HS;
    const size_t bh = (size_t)b * s.NH + h, W = ((size_t)s.NH + 2 * (size_t)s.NKV) * HS, HQ = (size_t)s.NH * HS;
    const double scale = j->scale;
    load(w->Q, j->qkv, b, T, HS, W, (size_t)h * HS);
    load(w->O, j->out_in, b, T, HS, HQ, (size_t)h * HS);
    load(w->dO, j->dout, b, T, HS, HQ, (size_t)h * HS);
    memset(w->dQ, 0, (size_t)T * HS * sizeof(double));
    for (int t = 0; t < T; t++) {
        const double *dOt = w->dO + (size_t)t * HS, *Qt = w->Q + (size_t)t * HS;
        w->D[t] = dot(dOt, w->O + (size_t)t * HS, HS);
        check_row(j, w, bh, t, dr);
        const double given = j->stats_in[bh * T + t]; /* backward from the given statistics */
        for (int u = 0; u <= t; u++) {
            const double *Ku = w->K + (size_t)u * HS, *Vu = w->V + (size_t)u * HS;
            const double p = exp(w->s[u] - given), dp = dot(dOt, Vu, HS), ds = p * (dp - w->D[t]);
            double *dQt = w->dQ + (size_t)t * HS, *dKu = w->dK + (size_t)u * HS, *dVu = w->dV + (size_t)u * HS;
            for (int d = 0; d < HS; d++) {
                dQt[d] += scale * ds * Ku[d];
                dKu[d] += scale * ds * Qt[d];
                dVu[d] += p * dOt[d];
            }
        }
    }
    store(j->dqkv, w->dQ, b, T, HS, W, (size_t)h * HS);
}

/* One (sequence, key/value head) at a time: its K and V, then its query heads in order
 * (forward: out and stats; backward: dQ of each, dK and dV summed over them in double and
 * rounded once), as cuDNN's grouped-query attention computes. */
static void run_job(void *arg) {
    job *j = arg;
    const dtc_shape s = j->s;
    const int T = s.T, HS = s.HS, G = s.NH / s.NKV;
    const size_t W = ((size_t)s.NH + 2 * (size_t)s.NKV) * HS, th = (size_t)T * HS;
    bufs w = bufs_new(T, HS);
    drift dr = {0, 0, 0, 0};
    for (int b = 0; b < s.B; b++)
        for (int g = 0; g < s.NKV; g++) {
            const size_t kcol = ((size_t)s.NH + g) * HS, vcol = ((size_t)s.NH + s.NKV + g) * HS;
            load(w.K, j->qkv, b, T, HS, W, kcol);
            load(w.V, j->qkv, b, T, HS, W, vcol);
            memset(w.dK, 0, th * sizeof(double));
            memset(w.dV, 0, th * sizeof(double));
            for (int h = g * G; h < (g + 1) * G; h++) {
                if (j->bwd) bwd_head(j, &w, b, h, &dr);
                else fwd_head(j, &w, b, h);
            }
            if (!j->bwd) continue;
            store(j->dqkv, w.dK, b, T, HS, W, kcol);
            store(j->dqkv, w.dV, b, T, HS, W, vcol);
        }
    if (dr.stats)
        mock_report("cuDNN attention backward #%lu (B %d T %d NH %d NKV %d HS %d): %zu of %zu statistics are not "
                    "forward's log-sum-exp for these qkv (worst off by %g): stats overwritten or the wrong buffer?",
                    j->k, s.B, T, s.NH, s.NKV, HS, dr.stats, (size_t)s.B * s.NH * T, dr.worst_stats);
    if (dr.out)
        mock_report("cuDNN attention backward #%lu (B %d T %d NH %d NKV %d HS %d): %zu of %zu elements of out are "
                    "not forward's output for these qkv (worst off by %g): out overwritten, or not rounded from bf16?",
                    j->k, s.B, T, s.NH, s.NKV, HS, dr.out, (size_t)s.B * T * s.NH * HS, dr.worst_out);
    bufs_free(&w);
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

/* the mask matches the shape: packed rows pass theirs, others none; 0 or reported */
static int check_mask(const char *call, unsigned long k, dtc_shape s, const void *mask, char *why, size_t n) {
    if (!s.packed == !mask) return 0;
    mock_report("cuDNN attention %s #%lu: %s", call, k,
                s.packed ? "packed rows (dtc_shape.packed) without their mask" : "a mask for rows that are not packed");
    say(why, n, "mock cuDNN: bad arguments to %s (MOCK ERROR above)", call);
    return -1;
}

int dtc_att_fwd(dtc_att *a, void *out, float *stats, const void *qkv, const void *mask, dtc_shape s, void *ws,
                size_t ws_bytes, char *why, size_t n) {
    if (!live(a, "dtc_att_fwd", why, n)) return -1;
    const unsigned long k = __atomic_add_fetch(&a->calls, 1, __ATOMIC_SEQ_CST);
    if (trace())
        fprintf(stderr, "MOCK ATT: forward #%lu B %d T %d NH %d NKV %d HS %d%s qkv %p out %p stats %p ws %p (%zu "
                "bytes)\n", k, s.B, s.T, s.NH, s.NKV, s.HS, s.packed ? " packed" : "", qkv, out, (void *)stats, ws,
                ws_bytes);
    const span in[] = {{qkv, qkv_bytes(s), "qkv"}, {mask, mask_bytes(s), "mask"}};
    const span outs[] = {{out, out_bytes(s), "out"}, {stats, stats_bytes(s), "stats"}};
    if (check_mask("forward", k, s, mask, why, n) ||
        check_call("forward", k, s, ws, ws_bytes, in, s.packed ? 2 : 1, outs, 2, why, n))
        return -1;
    job j = {.bwd = 0, .k = k, .s = s, .scale = 1.0f / sqrtf((float)s.HS), .qkv = qkv, .mask = mask, .out = out,
             .stats = stats};
    return enqueue(a, &j, why, n);
}

int dtc_att_bwd(dtc_att *a, void *dqkv, const void *dout, const void *qkv, const void *mask, const void *out,
                const float *stats, dtc_shape s, void *ws, size_t ws_bytes, char *why, size_t n) {
    if (!live(a, "dtc_att_bwd", why, n)) return -1;
    const unsigned long k = __atomic_add_fetch(&a->calls, 1, __ATOMIC_SEQ_CST);
    if (trace())
        fprintf(stderr, "MOCK ATT: backward #%lu B %d T %d NH %d NKV %d HS %d%s dqkv %p dout %p qkv %p out %p stats %p "
                "ws %p (%zu bytes)\n", k, s.B, s.T, s.NH, s.NKV, s.HS, s.packed ? " packed" : "", dqkv, dout, qkv, out,
                (const void *)stats, ws, ws_bytes);
    const span in[] = {{qkv, qkv_bytes(s), "qkv"}, {out, out_bytes(s), "out"}, {dout, out_bytes(s), "dout"},
                       {stats, stats_bytes(s), "stats"}, {mask, mask_bytes(s), "mask"}};
    const span outs[] = {{dqkv, qkv_bytes(s), "dqkv"}};
    if (check_mask("backward", k, s, mask, why, n) ||
        check_call("backward", k, s, ws, ws_bytes, in, s.packed ? 5 : 4, outs, 1, why, n))
        return -1;
    job j = {.bwd = 1, .k = k, .s = s, .scale = 1.0f / sqrtf((float)s.HS), .qkv = qkv, .mask = mask, .out_in = out,
             .dout = dout, .stats_in = stats, .dqkv = dqkv};
    return enqueue(a, &j, why, n);
}
