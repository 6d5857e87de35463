/* dtk.h — launchers for dtrain's own CUDA kernels (the .cu files in kernels/), called by src/ops/ops_cuda.c.
 *
 * Every launcher enqueues its kernel(s) on stream `s`, never synchronises, and returns the
 * launch status (cudaGetLastError() right after the launch; cudaSuccess for n == 0).
 * Semantics are those of the op of the same name in include/dtrain/ops.h (the CPU backend,
 * src/ops/ops_cpu.c, is the reference the GPU tests compare against). All tensors are row-major
 * float32 unless marked bf16, except activations: the `void *` buffers of launchers that take a
 * dtk_type `t` hold elements of that type (the backend's act_dtype), read into float, computed
 * in float and rounded once when stored. Every reduction is deterministic: the same inputs give the same
 * bits on every run (fixed reduction trees, no floating-point atomics), because replicas must
 * stay bit-identical and a resumed run must match an uninterrupted one.
 *
 * Scratch: launchers that need temporary device memory take `work` with at least the number
 * of bytes the matching *_work_bytes() function returns for the same sizes. */
#ifndef DTRAIN_DTK_H
#define DTRAIN_DTK_H

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>

/* bf16 buffers: __nv_bfloat16 in CUDA C++, its 16 raw bits in C (the same layout) */
#ifdef __cplusplus
typedef __nv_bfloat16 dtk_bf16;
extern "C" {
#else
typedef unsigned short dtk_bf16;
#endif
/* the element of activation buffers */
typedef enum { DTK_F32 = 0, DTK_BF16 = 1 } dtk_type;

/* out(B,T,C) = wte[tokens[b,t]] + wpe[p] (wpe NULL: wte[tokens[b,t]]), p = t, or pos[b,t] (packed
 * rows: ops.h dt_att_shape) */
cudaError_t dtk_encoder_fwd(cudaStream_t s, dtk_type t, void *out, const int *tokens, const int *pos, const float *wte,
                            const float *wpe, int B, int T, int C);
/* dtk_encoder_fwd from a share of the table (tensor parallelism): wte holds the rows [v0, v0 + V)
 * of the vocabulary; a token outside them gives a zero row (its position still added) */
cudaError_t dtk_encoder_part_fwd(cudaStream_t s, dtk_type t, void *out, const int *tokens, const int *pos,
                                 const float *wte, const float *wpe, int v0, int V, int B, int T, int C);
/* dtk_encoder_part_fwd from bf16 wte and wpe (NULL: none), widened exactly */
cudaError_t dtk_encoder16_fwd(cudaStream_t s, dtk_type t, void *out, const int *tokens, const int *pos,
                              const dtk_bf16 *wte, const dtk_bf16 *wpe, int v0, int V, int B, int T, int C);
/* dwte(V,C) += sum of dout rows whose token is v (summed in increasing (b,t) order, except that a
 * run of one token covering 64 consecutive sorted positions adds them as one partial sum: a fixed
 * order, within rounding of the CPU's); dwpe(T,C) += sum over b of dout[b,t] (in increasing b;
 * skipped when dwpe is NULL; packed rows, pos non-NULL: row p += the dout rows at position p, in
 * increasing (b,t), as the CPU adds them). Every token must lie in [0, V): the sort orders only the bits that
 * needs (V <= 0: not known, all 32 bits). */
size_t dtk_encoder_bwd_work_bytes(int B, int T, int C);
cudaError_t dtk_encoder_bwd(cudaStream_t s, dtk_type t, float *dwte, float *dwpe, const void *dout, const int *tokens,
                            const int *pos, int B, int T, int C, int V, void *work, size_t work_bytes);
/* dtk_encoder_bwd into a share of the table, dwte(V,C) the rows [v0, v0 + V): tokens outside
 * them are skipped (the same work space) */
cudaError_t dtk_encoder_part_bwd(cudaStream_t s, dtk_type t, float *dwte, float *dwpe, const void *dout, const int *tokens,
                                 const int *pos, int v0, int V, int B, int T, int C, void *work, size_t work_bytes);

/* out(N,C) = (inp - mean) * rstd * w + b; mean(N), rstd(N) = 1/sqrt(var + 1e-5) (biased var) */
cudaError_t dtk_layernorm_fwd(cudaStream_t s, dtk_type t, void *out, float *mean, float *rstd, const void *inp, const float *w,
                              const float *b, int N, int C);
/* Column reductions (LayerNorm's dw, db and the bias gradient) run as one kernel that the last
 * block of each column tile finishes: `flags` is dtk_colsum_flags(columns) zero-initialised
 * counters in device memory, which every launch leaves zero again; launches that share them
 * must be ordered (one stream). `work` holds the partial sums. */
int dtk_colsum_flags(int N);
/* dinp(N,C) +=, dw(C) +=, db(C) += (the ops.h layernorm_bwd; dw and db both NULL: frozen, dinp only) */
size_t dtk_layernorm_bwd_work_bytes(int N, int C);
cudaError_t dtk_layernorm_bwd(cudaStream_t s, dtk_type t, void *dinp, float *dw, float *db, const void *dout, const void *inp,
                              const float *w, const float *mean, const float *rstd, int N, int C, void *work,
                              size_t work_bytes, unsigned *flags);

/* RMSNorm: out(N,C) = w * (inp * rstd), rstd(N) = 1/sqrt(mean(inp^2) + eps) (kernels/layernorm.cu) */
cudaError_t dtk_rmsnorm_fwd(cudaStream_t s, dtk_type t, void *out, float *rstd, const void *inp, const float *w, int N,
                            int C, float eps);
/* dinp(N,C) +=, dw(C) += (the ops.h rmsnorm_bwd); dw by the column reduction above (NULL: frozen, dinp only) */
size_t dtk_rmsnorm_bwd_work_bytes(int N, int C);
cudaError_t dtk_rmsnorm_bwd(cudaStream_t s, dtk_type t, void *dinp, float *dw, const void *dout, const void *inp,
                            const float *w, const float *rstd, int N, int C, void *work, size_t work_bytes,
                            unsigned *flags);

/* GELU, tanh form: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); bwd overwrites dinp */
cudaError_t dtk_gelu_fwd(cudaStream_t s, dtk_type t, void *out, const void *inp, size_t n);
cudaError_t dtk_gelu_bwd(cudaStream_t s, dtk_type t, void *dinp, const void *inp, const void *dout, size_t n);

/* SwiGLU over inp(N,2F) rows [gate | up]: out(N,F) = silu(gate) * up, silu(x) = x / (1 + e^-x);
 * bwd: dinp(N,2F) = [dout * up * silu'(gate) | dout * silu(gate)] (overwritten) */
cudaError_t dtk_swiglu_fwd(cudaStream_t s, dtk_type t, void *out, const void *inp, int N, int F);
cudaError_t dtk_swiglu_bwd(cudaStream_t s, dtk_type t, void *dinp, const void *inp, const void *dout, int N, int F);

/* A range of a float vector: elements offset .. offset + numel - 1 (ops.h dt_range's layout). */
typedef struct dtk_range {
    size_t offset, numel;
} dtk_range;

/* out = a + b (out may alias a or b);  x *= scale over n_ranges ranges (a device table) of
 * `total` elements in all, in one launch */
cudaError_t dtk_add(cudaStream_t s, dtk_type t, void *out, const void *a, const void *b, size_t n);
cudaError_t dtk_scale(cudaStream_t s, float *x, const dtk_range *ranges, int n_ranges, size_t total, float scale);

/* dbias(N) += column sums of dout(M,N) (rows summed in a fixed order) */
size_t dtk_bias_bwd_work_bytes(int M, int N);
cudaError_t dtk_bias_bwd(cudaStream_t s, dtk_type t, float *dbias, const void *dout, int M, int N, void *work,
                         size_t work_bytes, unsigned *flags);

/* Row-wise softmax + cross-entropy over logits(N,V): probs(N,V) (may alias logits),
 * losses(N) = -log probs[n, targets[n]]; targets[n] < 0: loss 0 (probs still written). The rows
 * of logits, probs and dlogits are ld >= V elements apart; only their first V are touched. */
cudaError_t dtk_xent_fwd(cudaStream_t s, dtk_type t, float *losses, void *probs, const void *logits, const int *targets, int N,
                         int V, int ld);
/* losses as dtk_xent_fwd and dlogits as dtk_xent_bwd would give them, in one launch (the
 * probabilities never stored); dlogits may alias logits */
cudaError_t dtk_xent_fused(cudaStream_t s, dtk_type t, float *losses, void *dlogits, const void *logits, const int *targets,
                           float scale, int N, int V, int ld);
/* dlogits(N,V) = (probs - onehot(targets)) * scale; rows with targets < 0 are all 0;
 * dlogits may alias probs. */
cudaError_t dtk_xent_bwd(cudaStream_t s, dtk_type t, void *dlogits, const void *probs, const int *targets, float scale, int N,
                         int V, int ld);
/* A share of the cross-entropy (tensor parallelism; ops.h xent_part_stats, xent_part_bwd): the
 * logits' columns [v0, v0 + V) of the whole rows. stats(N,4): each row's max, its sum of exp(x -
 * max) (in double, rounded once), the target's logit where the target is among these columns
 * (else 0), and the column of the max (v0 + j, the first on ties). */
cudaError_t dtk_xent_part_stats(cudaStream_t s, dtk_type t, float *stats, const void *logits, const int *targets, int v0,
                                int N, int V, int ld);
/* dlogits = (exp(x - lse) - onehot(target)) * scale from the whole rows' log-sum-exp lse(N); rows
 * with targets < 0 are all 0; dlogits may alias logits */
cudaError_t dtk_xent_part_bwd(cudaStream_t s, dtk_type t, void *dlogits, const void *logits, const float *lse,
                              const int *targets, int v0, float scale, int N, int V, int ld);

/* out(n,C) = x[rows[i]];  dx[rows[i]] += dout(n,C) (i in increasing order, duplicates allowed) */
cudaError_t dtk_gather_rows(cudaStream_t s, dtk_type t, void *out, const void *x, const int *rows, int n, int C);
cudaError_t dtk_scatter_add_rows(cudaStream_t s, dtk_type t, void *dx, const void *dout, const int *rows, int n, int C);

/* Attention helpers, over an attention's shape (ops.h dt_att_shape): B sequences of T rows,
 * NH query heads and NKV key/value heads (NH a multiple of NKV; query head h reads key/value
 * head h / (NH/NKV)), each hs wide. qkv(B,T,(NH+2NKV)hs) rows [q (NH*hs) | k (NKV*hs) | v
 * (NKV*hs)], head h of each part at its columns h*hs..; out(B,T,NH*hs).
 * qkv_split: q (B,NH,T,hs), k and v (B,NKV,T,hs) from qkv; qkv_merge: dqkv from dq, dk, dv of
 * those shapes. heads_merge: out from y(B,NH,T,hs); heads_split: dy(B,NH,T,hs) from dout.
 * qkv, dqkv, out and dout are activations; the per-head q, k, v, y, dy, dq, dk, dv are float. */
typedef struct dtk_att_shape {
    int B, T, NH, NKV, hs;
    const int *pos; /* NULL, or packed rows' positions (B*T, device memory): ops.h dt_att_shape */
} dtk_att_shape;
cudaError_t dtk_qkv_split(cudaStream_t s, dtk_type t, float *q, float *k, float *v, const void *qkv, dtk_att_shape a);
cudaError_t dtk_qkv_merge(cudaStream_t s, dtk_type t, void *dqkv, const float *dq, const float *dk, const float *dv,
                          dtk_att_shape a);
cudaError_t dtk_heads_merge(cudaStream_t s, dtk_type t, void *out, const float *y, dtk_att_shape a);
cudaError_t dtk_heads_split(cudaStream_t s, dtk_type t, float *dy, const void *dout, dtk_att_shape a);
/* In place over att(B*NH,T,T) (a.B, a.NH, a.T): row t becomes softmax(scale * att[t, lo..t]) at
 * columns lo..t and exact 0 elsewhere (causal; lo 0, or with packed rows a.pos the first row of
 * its example: t - pos[b,t]). */
cudaError_t dtk_causal_softmax_fwd(cudaStream_t s, float *att, dtk_att_shape a, float scale);
/* In place over datt(B*NH,T,T): datt = scale * att * (datt - sum_j att*datt) on row t, columns lo..t;
 * exact 0 elsewhere. */
cudaError_t dtk_causal_softmax_bwd(cudaStream_t s, float *datt, const float *att, dtk_att_shape a, float scale);
/* Packed rows (a.pos non-NULL) for cuDNN's fused attention, which takes them as an additive
 * mask: mask(B,T,T) bf16, rows ld elements apart (columns T.. of a row are not written), row t
 * of sequence b is 0 at the columns of its example up to itself (t - pos[b,t] .. t) and
 * DTK_ATT_MASKED elsewhere. Finite, not -inf: a flash kernel's running
 * maximum over a tile of only masked columns stays finite, and what it scaled by then is
 * rescaled by exp(DTK_ATT_MASKED + ...) = exactly 0 once the row's own columns come, so the
 * result is the masked softmax's, never NaN. A no-op when a.pos is NULL. */
#define DTK_ATT_MASKED (-1.0e9f)
cudaError_t dtk_att_example_mask(cudaStream_t s, dtk_bf16 *mask, int ld, dtk_att_shape a);

/* Attention of n = a.T new rows (positions pos0..pos0+n-1 of one sequence, a.B 1) over a
 * key/value cache (ops.h attention_cached): the rows' keys and values are copied from qkv into
 * rows pos0.. of kcache and vcache (NKV*hs wide), then out(n,NH*hs) = softmax(scale q k^T) v
 * over cache rows 0..pos0+i for new row i, each query head over its key/value head. scratch:
 * n*NH*(pos0+n) floats (the probabilities). */
cudaError_t dtk_attention_cached(cudaStream_t s, dtk_type t, void *out, void *kcache, void *vcache, float *scratch,
                                 const void *qkv, int pos0, dtk_att_shape a);

/* Rotary positions (ops.h rope_fwd, rope_bwd) on the q and k heads of qkv (laid out as above),
 * in place: row t of each sequence at position pos0 + t (packed rows, a.pos: pos[b,t]), the pair (i, i + hs/2) of each head
 * rotated by sign * a, a = (float)pos * inv_freq[i] (hs/2 floats, device memory); sign 1
 * forward, -1 backward (on dqkv). hs even, at most 1024 (kernels/rope.cu). */
cudaError_t dtk_rope(cudaStream_t s, dtk_type t, void *qkv, const float *inv_freq, int pos0, dtk_att_shape a,
                     float sign);

/* One stretch of the AdamW update in device memory: elements start.. of the flattened pieces
 * (start: the sum of the earlier pieces' lengths, increasing) are p/g[offset..], m/v[moff..];
 * decay 1: with the weight decay. */
typedef struct dtk_adamw_piece {
    size_t start, offset, moff;
    int decay;
} dtk_adamw_piece;

/* AdamW as torch.optim.AdamW (ops.h adamw), t >= 1, over n_pieces pieces (a device table) of
 * `total` elements in all, in one launch. p16 (may be NULL) receives the bf16 rounding of the
 * updated p in the same pass, at the same offsets as p. */
cudaError_t dtk_adamw(cudaStream_t s, float *p, dtk_bf16 *p16, const float *g, float *m, float *v,
                      const dtk_adamw_piece *pieces, int n_pieces, size_t total, float lr, float beta1, float beta2,
                      float eps, float weight_decay, int t);

/* *out (device double) = sum of x[i]^2 in double over n_ranges ranges (a device table) of
 * `total` elements in all, fixed reduction order (from total alone): two launches */
size_t dtk_sumsq_work_bytes(size_t total);
cudaError_t dtk_sumsq(cudaStream_t s, double *out, const float *x, const dtk_range *ranges, int n_ranges, size_t total,
                      void *work, size_t work_bytes);
/* *acc (device double) += sum in double of losses(n) over the rows with targets[i] >= 0
 * (targets NULL: all), one block, fixed order */
cudaError_t dtk_loss_sum(cudaStream_t s, double *acc, const float *losses, const int *targets, int n);

/* idx(N) = column of the largest element of row n of x(N,V), rows ld >= V apart, the first
 * one on ties (kernels/argmax.cu) */
cudaError_t dtk_argmax(cudaStream_t s, dtk_type t, int *idx, const void *x, int N, int V, int ld);
/* out(M,N) += bias(N) on every row, or with add 0 out = bias (kernels/argmax.cu; used where
 * cuBLASLt offers no bias epilogue for a shape: a bf16 product then adds onto the bias rows,
 * rounding once, as the epilogue does) */
cudaError_t dtk_add_bias(cudaStream_t s, dtk_type t, void *out, const float *bias, int M, int N, int add);

/* out(n) = bf16 round-to-nearest-even of in(n) */
cudaError_t dtk_cast_bf16(cudaStream_t s, dtk_bf16 *out, const float *in, size_t n);
/* the same over `rows` rows of `cols` elements, `ld` apart in in and out: the columns from
 * cols to ld are neither read nor written (a padded output's padding) */
cudaError_t dtk_cast_bf16_rows(cudaStream_t s, dtk_bf16 *out, const float *in, size_t rows, size_t cols, size_t ld);
/* out(n) = in(n) as float32 (exact); the nccl collective's DT_WIRE_BF16 */
cudaError_t dtk_widen_bf16(cudaStream_t s, float *out, const dtk_bf16 *in, size_t n);

/* *out (one device int) = 42: the smallest kernel, for the backend's probe (kernels/probe.cu) */
cudaError_t dtk_probe(cudaStream_t s, int *out);

#ifdef __cplusplus
}
#endif

#endif
