/* ops.h — the op table: every numeric operation the model needs, implemented once per
 * backend (ops_cpu.c now, ops_cuda.c later). model.c only calls through this table, with
 * pointers it got from the table's alloc; it never includes BLAS or CUDA headers.
 *
 * Conventions (all tensors row-major float32, shapes in comments):
 *   - parameter gradients (dw, db, dwte, dwpe) are ACCUMULATED (+=), so gradient
 *     accumulation over micro-batches needs no extra pass;
 *   - input gradients are OVERWRITTEN, except layernorm_bwd and encoder paths that write
 *     into the residual stream, which ACCUMULATE (marked "+=" below);
 *   - integer index arrays (tokens, targets, rows) live in backend memory too.
 * Functions cannot fail on valid arguments; argument checking is the model's job. A device
 * backend records the first failure of a call (e.g. an asynchronous kernel fault) and turns
 * later ops into no-ops; `check` reports it. */
#ifndef DTRAIN_OPS_H
#define DTRAIN_OPS_H

#include <stddef.h>

#include "dtrain/status.h"

typedef struct dt_ops dt_ops;

struct dt_ops {
    const char *name; /* "cpu", "cuda" */
    void *ctx;        /* backend state, passed as the first argument */

    /* memory: alloc returns zeroed memory; free accepts NULL */
    dt_status (*alloc)(void *ctx, size_t bytes, const char *what, void **out);
    void (*free)(void *ctx, void *p);
    void (*upload)(void *ctx, void *dst, const void *host_src, size_t bytes);
    void (*download)(void *ctx, void *host_dst, const void *src, size_t bytes);
    void (*zero)(void *ctx, void *p, size_t bytes);

    /* out(B,T,C) = wte[tokens] + wpe[t] */
    void (*encoder_fwd)(void *ctx, float *out, const int *tokens, const float *wte, const float *wpe,
                        int B, int T, int C);
    /* dwte(V,C) += ..., dwpe(T,C) += ... from dout(B,T,C); deterministic */
    void (*encoder_bwd)(void *ctx, float *dwte, float *dwpe, const float *dout, const int *tokens,
                        int B, int T, int C);

    /* out(N,C) = (inp - mean) * rstd * w + b; saves mean(N), rstd(N). eps = 1e-5 */
    void (*layernorm_fwd)(void *ctx, float *out, float *mean, float *rstd, const float *inp,
                          const float *w, const float *b, int N, int C);
    /* dinp(N,C) +=, dw(C) +=, db(C) += */
    void (*layernorm_bwd)(void *ctx, float *dinp, float *dw, float *db, const float *dout,
                          const float *inp, const float *w, const float *mean, const float *rstd,
                          int N, int C);

    /* out(M,N) = inp(M,K) @ W + bias(N) (bias may be NULL).
     * w_trans = 0: W stored (K,N) (HF Conv1D layout); w_trans = 1: W stored (N,K) (wte, score). */
    void (*matmul_fwd)(void *ctx, float *out, const float *inp, const float *w, const float *bias,
                       int M, int K, int N, int w_trans);
    /* dinp(M,K) = dout @ W^T (overwritten; skipped if dinp NULL); dw += (skipped if NULL);
     * dbias += (if not NULL) */
    void (*matmul_bwd)(void *ctx, float *dinp, float *dw, float *dbias, const float *dout,
                       const float *inp, const float *w, int M, int K, int N, int w_trans);

    /* causal self-attention. qkv(B,T,3C) laid out [q | k | v], head h at columns h*hs..;
     * out(B,T,C); att(B,NH,T,T) receives the softmax probabilities (saved for backward),
     * exact zeros above the diagonal (future positions); scale 1/sqrt(C/NH). */
    void (*attention_fwd)(void *ctx, float *out, float *att, const float *qkv, int B, int T, int C,
                          int NH);
    /* dqkv(B,T,3C) overwritten; att as written by attention_fwd; datt(B,NH,T,T) is scratch. */
    void (*attention_bwd)(void *ctx, float *dqkv, float *datt, const float *dout, const float *qkv,
                          const float *att, int B, int T, int C, int NH);

    /* GELU, tanh form */
    void (*gelu_fwd)(void *ctx, float *out, const float *inp, size_t n);
    /* dinp = gelu'(inp) * dout (overwritten) */
    void (*gelu_bwd)(void *ctx, float *dinp, const float *inp, const float *dout, size_t n);

    /* out = a + b (out may alias a) */
    void (*add)(void *ctx, float *out, const float *a, const float *b, size_t n);

    /* Row-wise softmax + cross-entropy. probs(N,V) may alias logits(N,V).
     * losses(N) = -log probs[target]; rows with target < 0 are ignored (loss 0). */
    void (*xent_fwd)(void *ctx, float *losses, float *probs, const float *logits, const int *targets,
                     int N, int V);
    /* dlogits(N,V) = (probs - onehot(target)) * scale, 0 for ignored rows; may alias probs. */
    void (*xent_bwd)(void *ctx, float *dlogits, const float *probs, const int *targets, float scale,
                     int N, int V);

    /* idx(N) = index of the largest element of each row of x(N,V) (the first one on ties) */
    void (*argmax)(void *ctx, int *idx, const float *x, int N, int V);

    /* out(n,C) = x[rows[i]] (pooling);  dx[rows[i]] += dout(n,C) */
    void (*gather_rows)(void *ctx, float *out, const float *x, const int *rows, int n, int C);
    void (*scatter_add_rows)(void *ctx, float *dx, const float *dout, const int *rows, int n, int C);

    /* AdamW as torch.optim.AdamW: m,v updated, bias correction with step t >= 1,
     * decoupled decay p -= lr * wd * p. */
    void (*adamw)(void *ctx, float *p, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, int t);
    /* sum of squares in double (for the global grad norm) */
    double (*sumsq)(void *ctx, const float *x, size_t n);
    /* x *= s */
    void (*scale)(void *ctx, float *x, size_t n, float s);

    /* Declares params(n) the master weights (the model's parameter buffer) and marks any
     * working copy of them stale. A backend whose products take reduced-precision inputs (CUDA
     * with bf16) keeps a bf16 copy that products read instead of rounding the weights again:
     * refreshed before its next use after upload or zero touched params, and by adamw in the
     * same pass as the update. Whoever writes params otherwise (a collective) calls this again
     * afterwards; the model calls it with NULL, 0 before freeing params. The CPU backend
     * ignores it. */
    void (*set_master)(void *ctx, const float *params, size_t n);

    /* Waits for the queued work and returns the first failure since init (sticky), with its
     * message set (dt_error_set); DT_OK when all went well. The CPU backend never fails. */
    dt_status (*check)(void *ctx);
};

/* CPU backend (OpenBLAS + OpenMP). `threads` <= 0 leaves the library defaults.
 * dt_ops_cpu_free accepts NULL. */
dt_status dt_ops_cpu_init(dt_ops **out, int threads);
void dt_ops_cpu_free(dt_ops *ops);

#endif
