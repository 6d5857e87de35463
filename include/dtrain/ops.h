/* ops.h — the backend interface: one static const table of functions per backend (the CPU
 * backend in src/ops/ops_cpu.c, the CUDA backend in src/ops/ops_cuda.c), opened through the registry
 * (backend.h), which is the only code that knows which backends exist. A backend is
 * everything the model and the trainer need of a device: its lifecycle (open, close), what it
 * is (describe, precision, the element type of its activations), the memory it adds for a
 * shape (op-level maxima, never the model's own config), its collective for device buffers,
 * and every numeric operation the model needs. model.c only calls through this table, with
 * pointers it got from the table's alloc; it never includes BLAS or CUDA headers.
 *
 * Conventions (tensors row-major, shapes in comments):
 *   - parameters, their gradients and optimizer state are float (fp32, the master copy);
 *   - activations (everything forward computes and backward reads, and their gradients) are
 *     dt_act: an element whose type the backend chooses (act_dtype); the CPU's is float.
 *     Callers never look inside; they size them with dt_dtype_size(act_dtype(...));
 *   - LayerNorm statistics and per-row losses are float; index arrays (tokens, targets,
 *     rows, predictions) are int; all of them live in backend memory;
 *   - parameter gradients (dw, db, dwte, dwpe) are ACCUMULATED (+=), so gradient
 *     accumulation over micro-batches needs no extra pass;
 *   - input gradients are OVERWRITTEN, except layernorm_bwd and encoder paths that write
 *     into the residual stream, which ACCUMULATE (marked "+=" below).
 * Functions cannot fail on valid arguments; argument checking is the model's job. A device
 * backend records the first failure of a call (e.g. an asynchronous kernel fault) and turns
 * later ops into no-ops; `check` reports it. */
#ifndef DTRAIN_OPS_H
#define DTRAIN_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/bf16.h" /* dt_bf16_to_float: a bf16 activation's 16 bits as a float (downloaded logits) */
#include "dtrain/status.h"

typedef struct dt_ops dt_ops;
typedef struct dt_comm dt_comm;

/* An open backend: its table and its state (passed to every function as `ctx`). */
typedef struct dt_backend {
    const dt_ops *ops;
    void *ctx;
} dt_backend;

/* An activation element (see the conventions above): never dereferenced outside a backend. */
typedef struct dt_act dt_act;

typedef enum { DT_DTYPE_F32 = 0, DT_DTYPE_BF16 } dt_dtype;
static inline size_t dt_dtype_size(dt_dtype t) { return t == DT_DTYPE_BF16 ? 2 : 4; }
/* A range of a flat float buffer (the parameters, their gradients), in floats. */
typedef struct dt_range {
    size_t offset, numel;
} dt_range;

/* One stretch of an AdamW update (ops.h adamw): params and grads at offset.., moments at moff..,
 * numel floats; decay 1: with the weight decay, 0: without (biases, LayerNorm). */
typedef struct dt_adamw_piece {
    size_t offset, moff, numel;
    int decay;
} dt_adamw_piece;

/* An attention's shape: B sequences of T rows, NH query heads and NKV key/value heads (NH a
 * multiple of NKV: query head h reads key/value head h / (NH / NKV); GPT-2: NKV = NH), each hs
 * wide. A row of its input qkv is [q (NH*hs) | k (NKV*hs) | v (NKV*hs)], head h of each part at
 * columns h*hs..; a row of its output is NH*hs wide, head h at h*hs; scale 1/sqrt(hs).
 * pos NULL: row t of a sequence is at position t and attends to rows 0..t. Else packed rows
 * (data.packing): pos(B*T), backend memory, is each row's position in its example, and the
 * example starts at row t - pos[b*T+t] of the sequence: a row attends to rows of its own
 * example only (t - pos .. t), and rope rotates it by its pos. Examples are contiguous, so
 * pos[t] is 0 or pos[t-1] + 1. The choice of fused attention (attention_bytes) sees whether
 * pos is NULL, never its values. Cached attention (decoding) takes pos NULL. */
typedef struct dt_att_shape {
    int B, T, NH, NKV, hs;
    const int *pos;
} dt_att_shape;

/* What a backend is opened with. */
typedef struct dt_backend_cfg {
    int device;    /* index among the visible devices (device backends) */
    int precision; /* products: 1 bf16 inputs (fp32 accumulation), 0 fp32, -1 auto (bf16 where the device has it) */
    int rank;      /* this worker's rank, named in messages */
    int threads;   /* CPU: BLAS/OpenMP threads (<= 0: the libraries' defaults) */
    int inference; /* 1: forward ops only are expected (generate, predict): no backward plans or
                      workspaces made ahead (a backward op still works, planned when called) */
} dt_backend_cfg;

/* The largest call of each op family a model will make (dt_model_op_sizes): what a backend
 * sizes its scratch by, so that no backend needs to know the model. */
typedef struct dt_op_sizes {
    size_t matmul_in;         /* elements of the largest product input that is not a weight, inp(M,K) */
    size_t matmul_out;        /* ... and of the largest output or output gradient, out(M,N) */
    int bias_rows, bias_cols; /* the largest bias gradient's dout(M,N) */
    dt_att_shape att;         /* attention's largest call */
    int ln_rows, ln_width;    /* layernorm_bwd, rmsnorm_bwd: N, C */
    int enc_batch, enc_seq;   /* encoder_bwd: B, T */
    int enc_width, enc_vocab; /* ... C, and V: every token is below V. CUDA keeps the largest V it
                                 has reserved and from then on sorts only the token bits that needs
                                 (a token at or above it: a caller's error, misplaced in the sort) */
    size_t vector;            /* sumsq, scale, adamw: the longest vector (the parameters kept in floats) */
    size_t inputs;            /* upload_async: the bytes one forward uploads (tokens, targets, rows) */
    int head_rows, head_in;   /* the output head's weight, (N,K) with w_trans: vocabulary (or labels) x n_embd */
    int head_bf16;            /* 1: the output head's weight is bf16 (matmul16_fwd: model.lora.base_dtype), and
                                 zero rows follow it in its buffer up to logits_stride(head_rows): a backend
                                 may run its products at that width */
    size_t base16;            /* model.lora.base_dtype bf16: the elements of the largest bf16 weight, 0 without */
    size_t lora_h;            /* model.lora: the elements of its products' h(M,r) and dh (lora_fwd, lora_bwd), 0 without */
} dt_op_sizes;

/* How a backend describes itself in the start-up report. */
typedef struct dt_backend_desc {
    char per_worker[64]; /* what one worker uses: "2 threads", "1 GPU" */
    char device[320];    /* "GPU 0 (NVIDIA H200, 139.81 GiB) on host"; "" for host backends */
    char bus_id[32];     /* the device's PCI bus id, "00000000:3B:00.0" (NVML's form, for the
                            launcher's GPU samples); "" for host backends */
} dt_backend_desc;

struct dt_ops {
    const char *name;   /* "cpu", "cuda": its training.device value */
    const char *memory; /* what its memory is called in messages ("GPU memory"); NULL: host memory */
    const char *collective; /* the name of device_comm's collective ("nccl"); NULL when it has none */
    /* 1: training and evaluation may give it batches of rows shorter than data.seq_len, a few
     * lengths (data.pad_to: longest); 0: every batch's rows are data.seq_len long */
    int short_rows;

    /* ---- without an open backend (--dry-run, --version) ---- */
    /* element type of the activations at that precision (bf16 0/1) */
    dt_dtype (*act_dtype)(int bf16);
    /* The row stride, in elements (>= V), of the logits (rows, V) this backend wants: V, or V
     * padded so that every row starts aligned for its products and kernels (CUDA: a multiple of
     * 128, GPT-2's 50257 -> 50304). The weights keep V rows, so nothing of the padding is
     * trained or saved; the padding columns are the backend's (matmul_fwd). */
    int (*logits_stride)(int V);
    /* memory the backend adds to the model's own for these op sizes: scratch, workspaces,
     * working copies of the weights (an estimate, for --dry-run and the start-up report) */
    size_t (*scratch_bytes)(const dt_op_sizes *sizes, int bf16);
    /* may be NULL: one line per library ("  NAME  runtime X (built with Y)[  MISMATCH: why]")
     * into buf; returns the number of mismatches */
    int (*versions)(char *buf, size_t n);

    /* ---- lifecycle ---- */
    /* DT_ERR_CONFIG with a hint for a device that is not there or lacks what cfg asks for;
     * *ctx is the backend's state. close accepts NULL. Called in the workers only (a device
     * context must never exist before fork). */
    dt_status (*open)(const dt_backend_cfg *cfg, void **ctx);
    void (*close)(void *ctx);
    void (*describe)(void *ctx, dt_backend_desc *out);
    int (*bf16)(void *ctx); /* 1 when products take bf16 inputs (precision resolved) */
    /* Host backends: the BLAS/OpenMP threads of the ops from now on (results do not depend on
     * it); NULL where threads mean nothing (a GPU backend). */
    void (*set_threads)(void *ctx, int threads);
    /* Grows the backend's scratch to `sizes` now, so that running out of memory happens at
     * start, naming the buffer, and nothing is reallocated mid-step. */
    dt_status (*reserve)(void *ctx, const dt_op_sizes *sizes);
    /* may be NULL: runs one trivial kernel and checks its result (doctor) */
    dt_status (*probe)(void *ctx);
    /* may be NULL: on 1 starts, on 0 ends the range an attached profiler records (CUDA:
     * cudaProfilerStart/Stop, what `ncu --profile-from-start off` waits for); the caller has
     * waited for the queued work first (check), so the range holds only what comes between */
    void (*profile)(void *ctx, int on);
    /* NULL when `collective` is (host collectives read this backend's buffers): the collective
     * for them, bootstrapped over the host communicator `boot` (every rank calls it; comm.h)
     * and ordered after the backend's queued work */
    dt_status (*device_comm)(void *ctx, dt_comm *boot, double timeout_s, dt_comm **out);
    /* NULL with device_comm: the device memory one such collective allocates for itself, with a
     * bf16 buffer for `wire_floats` gradients (0: none); static, so --dry-run can count it */
    size_t (*device_comm_bytes)(size_t wire_floats);

    /* ---- memory: alloc returns zeroed memory; free accepts NULL ---- */
    dt_status (*alloc)(void *ctx, size_t bytes, const char *what, void **out);
    void (*free)(void *ctx, void *p);
    void (*upload)(void *ctx, void *dst, const void *host_src, size_t bytes);
    void (*download)(void *ctx, void *host_dst, const void *src, size_t bytes);
    void (*zero)(void *ctx, void *p, size_t bytes);
    /* dst = src, both backend memory, not overlapping (queued like an op) */
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    /* dst = host_src, queued like an op: returns at once, and host_src may be rewritten at once (a
     * device backend copies it into pinned staging, made at open and grown by reserve to several
     * forwards' sizes->inputs, and waits for the device only when more than that is staged
     * between two checks). What a training step uploads; upload waits for the device. */
    void (*upload_async)(void *ctx, void *dst, const void *host_src, size_t bytes);
    /* Host memory for download_async (CUDA: pinned), zeroed; free_host accepts NULL. */
    dt_status (*alloc_host)(void *ctx, size_t bytes, const char *what, void **out);
    void (*free_host)(void *ctx, void *p);
    /* host_dst (from alloc_host) = src, queued like an op: host_dst holds it once the next check
     * returns DT_OK (zeros after a failure) */
    void (*download_async)(void *ctx, void *host_dst, const void *src, size_t bytes);

    /* ---- the model's operations ---- */
    /* out(B,T,C) = wte[tokens] + wpe[p] (wpe NULL: wte[tokens] alone, no learned positions), p
     * the row's position: t, or pos[b*T+t] with packed rows (pos non-NULL: dt_att_shape) */
    void (*encoder_fwd)(void *ctx, dt_act *out, const int *tokens, const int *pos, const float *wte, const float *wpe,
                        int B, int T, int C);
    /* dwte(V,C) += ..., dwpe(T,C) += ... (skipped when dwpe is NULL; row p sums the rows at
     * position p) from dout(B,T,C); deterministic */
    void (*encoder_bwd)(void *ctx, float *dwte, float *dwpe, const dt_act *dout, const int *tokens, const int *pos,
                        int B, int T, int C);

    /* out(N,C) = (inp - mean) * rstd * w + b; saves mean(N), rstd(N). eps = 1e-5 */
    void (*layernorm_fwd)(void *ctx, dt_act *out, float *mean, float *rstd, const dt_act *inp,
                          const float *w, const float *b, int N, int C);
    /* dinp(N,C) +=, dw(C) +=, db(C) += (dw and db NULL: frozen weights, skipped; only asked of a
     * backend with lora_fwd) */
    void (*layernorm_bwd)(void *ctx, dt_act *dinp, float *dw, float *db, const dt_act *dout,
                          const dt_act *inp, const float *w, const float *mean, const float *rstd,
                          int N, int C);

    /* May be NULL (a backend without the Llama family's ops). RMSNorm: out(N,C) = w * (inp *
     * rstd), rstd(N) = 1 / sqrt(mean(inp^2) + eps) kept for backward, in fp32. */
    void (*rmsnorm_fwd)(void *ctx, dt_act *out, float *rstd, const dt_act *inp, const float *w, int N, int C, float eps);
    /* dinp(N,C) +=, dw(C) += (dw NULL: as layernorm_bwd's) */
    void (*rmsnorm_bwd)(void *ctx, dt_act *dinp, float *dw, const dt_act *dout, const dt_act *inp, const float *w,
                        const float *rstd, int N, int C);

    /* out(M,N) = inp(M,K) @ W + bias(N) (bias may be NULL); out's rows are ldo >= N elements
     * apart (the logits: logits_stride); ldo > N only without a bias. Columns N.. are left as
     * they are, except that the output head's product (op sizes' head_rows x head_in, ldo its
     * logits_stride) may write zeros there: CUDA in bf16 runs it at the padded width, where
     * cuBLASLt has its fast kernels (GPT-2's 50257 rows took its slow generic one).
     * w_trans = 0: W stored (K,N) (HF Conv1D layout); w_trans = 1: W stored (N,K) (wte, score). */
    void (*matmul_fwd)(void *ctx, dt_act *out, const dt_act *inp, const float *w, const float *bias,
                       int M, int K, int N, int ldo, int w_trans);
    /* dinp(M,K) = dout @ W^T (overwritten; skipped if dinp NULL); dw += (skipped if NULL);
     * dbias += (if not NULL). dout's rows are ldo >= N apart (ldo > N only with dbias NULL);
     * the head's dinp may read its padding columns, which must then be finite (matmul_fwd left
     * zeros there): they are multiplied by zeros, contributing nothing. */
    void (*matmul_bwd)(void *ctx, dt_act *dinp, float *dw, float *dbias, const dt_act *dout,
                       const dt_act *inp, const float *w, int M, int K, int N, int ldo, int w_trans);

    /* May be NULL (a backend without model.lora.base_dtype bf16). The same products with a
     * frozen weight kept in bf16 (w: each element's 16 bits, stored as matmul_fwd's W; bias
     * float): matmul_fwd's out, and matmul_bwd's dinp alone (a frozen weight and its bias take
     * no gradient). A host backend (memory NULL) widens W to fp32, exactly, and runs its fp32
     * product (in pieces of op sizes' base16 elements at most); a device backend is asked for
     * them only when its products are bf16 (bf16(ctx) 1) and reads W as it is. */
    void (*matmul16_fwd)(void *ctx, dt_act *out, const dt_act *inp, const uint16_t *w, const float *bias, int M, int K,
                         int N, int ldo, int w_trans);
    void (*matmul16_bwd)(void *ctx, dt_act *dinp, const dt_act *dout, const uint16_t *w, int M, int K, int N, int ldo,
                         int w_trans);
    /* May be NULL (as matmul16_fwd). encoder_part_fwd with wte and wpe (NULL: none) in bf16:
     * wte holds the rows [v0, v0 + V) of the vocabulary (tensor parallelism's share; all of it:
     * 0, INT_MAX), a token outside them a zero row, its position still added. */
    void (*encoder16_fwd)(void *ctx, dt_act *out, const int *tokens, const int *pos, const uint16_t *wte,
                          const uint16_t *wpe, int v0, int V, int B, int T, int C);

    /* The backend memory one attention_fwd call of shape s keeps for backward (*att) and
     * the scratch attention_bwd needs (*datt), in bytes; callers size those buffers by it, for
     * every shape they will call with. ctx NULL (--dry-run): for a device on which the
     * backend's fused attention, if it has one, plans (so that nothing T x T is kept). With
     * ctx: what this backend will do; a fused backend plans the shape here, and where its
     * library refuses says why once and falls back to kernels that keep the probabilities.
     * The choice holds for every batch size of the same T, NH, NKV and hs. Returns 1 when att
     * will hold the probabilities (attention_fwd), 0 when it holds a fused attention's statistics. */
    int (*attention_bytes)(void *ctx, const dt_att_shape *s, int bf16, size_t *att, size_t *datt);

    /* causal self-attention (dt_att_shape: the layout of qkv and out, grouped query heads).
     * qkv(B,T,(NH+2NKV)hs), out(B,T,NH*hs). att (attention_bytes) receives what backward needs:
     * the softmax probabilities (B,NH,T,T) as floats, exact zeros above the diagonal (future
     * positions), or, for a fused attention, its softmax statistics (opaque). */
    void (*attention_fwd)(void *ctx, dt_act *out, void *att, const dt_act *qkv, const dt_att_shape *s);
    /* dqkv(B,T,(NH+2NKV)hs) overwritten (a key/value head's gradient sums its query heads');
     * out and att as written by attention_fwd (a fused attention reads its output again); datt
     * (attention_bytes) is scratch. */
    void (*attention_bwd)(void *ctx, dt_act *dqkv, void *datt, const dt_act *dout, const dt_act *qkv,
                          const dt_act *out, const void *att, const dt_att_shape *s);

    /* Attention of new rows over a key/value cache (generation, one sequence; s->B is 1, s->T
     * is n). qkv(n,(NH+2NKV)hs) holds the rows at positions pos0..pos0+n-1; their keys and
     * values are first copied into rows pos0.. of kcache and vcache (each (>= pos0+n, NKV*hs),
     * key/value head g at columns g*hs..), then out(n,NH*hs) = the causal attention of each new
     * row over cache rows 0..its position: what attention_fwd gives at those positions.
     * scratch: n*NH*(pos0+n) floats. */
    void (*attention_cached)(void *ctx, dt_act *out, dt_act *kcache, dt_act *vcache, float *scratch,
                             const dt_act *qkv, int pos0, const dt_att_shape *s);

    /* May be NULL (as rmsnorm_fwd). Rotary positions (RoPE, Hugging Face's rotate-half
     * convention) on the q and k heads of qkv (laid out as for attention), in place: row t of
     * each sequence is at position pos0 + t (packed rows, s->pos: at pos[b*T+t]; pos0 0); for a head's pair (i, i + hs/2), i < hs/2, at
     * angle a = pos * inv_freq[i] (a float product; inv_freq: hs/2 floats, backend memory):
     * x[i] <- x[i] cos a - x[i + hs/2] sin a, x[i + hs/2] <- x[i + hs/2] cos a + x[i] sin a.
     * v is untouched. */
    void (*rope_fwd)(void *ctx, dt_act *qkv, const float *inv_freq, int pos0, const dt_att_shape *s);
    /* The same rotation backwards (by -a) on dqkv's q and k parts, in place: the gradient
     * before rope_fwd from the one after. */
    void (*rope_bwd)(void *ctx, dt_act *dqkv, const float *inv_freq, int pos0, const dt_att_shape *s);

    /* May be NULL (as rmsnorm_fwd). SwiGLU: inp(N, 2F) rows [gate | up], out(N, F) =
     * silu(gate) * up, silu(x) = x / (1 + exp(-x)) (F: the MLP's width). */
    void (*swiglu_fwd)(void *ctx, dt_act *out, const dt_act *inp, int N, int F);
    /* dinp(N, 2F) overwritten: [dout * up * silu'(gate) | dout * silu(gate)] */
    void (*swiglu_bwd)(void *ctx, dt_act *dinp, const dt_act *inp, const dt_act *dout, int N, int F);

    /* May be NULL (a backend without LoRA). A LoRA adapter on a product's output: h(M,r) =
     * inp(M,K) @ A^T (A stored (r,K)), then out(M,N) += s * h @ B^T (B stored (N,r)); out's rows
     * ldo apart (a column range of a wider product's output). h: fp32 (M,r), for the backward. */
    void (*lora_fwd)(void *ctx, dt_act *out, float *h, const dt_act *inp, const float *A, const float *B, int M, int K,
                     int N, int r, int ldo, float s);
    /* Its backward, h (M,r) as lora_fwd left it: dh = s * dout @ B (M,r), dB += s * dout^T @ h,
     * dA += dh^T @ inp, dinp(M,K) += dh @ A; each of dinp, dA, dB skipped when NULL. dh: fp32
     * (M,r), scratch; dout NULL: dh holds the gradient already (tensor parallelism: the shares'
     * parts summed), and only dA and dinp come from it. */
    void (*lora_bwd)(void *ctx, dt_act *dinp, float *dA, float *dB, const float *h, float *dh, const dt_act *dout,
                     const dt_act *inp, const float *A, const float *B, int M, int K, int N, int r, int ldo, float s);

    /* May be NULL. The MLP's first product and its GELU at once: pre(M,N) = inp(M,K) @ W(K,N) +
     * bias and out(M,N) = gelu(pre), as matmul_fwd (w_trans 0) then gelu_fwd would give them,
     * except that out may be computed from pre before pre is rounded to an activation (CUDA:
     * cuBLASLt's GELU epilogue, where it has one for the shape; else those two calls). */
    void (*matmul_gelu_fwd)(void *ctx, dt_act *out, dt_act *pre, const dt_act *inp, const float *w, const float *bias,
                            int M, int K, int N);
    /* May be NULL. The backward of the product that reads gelu's output: dinp(M,K) = gelu'(pre)
     * * (dout(M,N) @ W^T), with W (K,N) (w_trans 0), and dw, dbias as matmul_bwd, as matmul_bwd
     * into tmp(M,K) then gelu_bwd(dinp, pre, tmp) would give them, except that the product may
     * meet gelu' before it is rounded (CUDA: cuBLASLt's DGELU epilogue, where it has one; else
     * those calls, with tmp as scratch). */
    void (*matmul_gelu_bwd)(void *ctx, dt_act *dinp, dt_act *tmp, float *dw, float *dbias, const dt_act *dout,
                            const dt_act *inp, const float *w, const dt_act *pre, int M, int K, int N);

    /* GELU, tanh form */
    void (*gelu_fwd)(void *ctx, dt_act *out, const dt_act *inp, size_t n);
    /* dinp = gelu'(inp) * dout (overwritten) */
    void (*gelu_bwd)(void *ctx, dt_act *dinp, const dt_act *inp, const dt_act *dout, size_t n);

    /* out = a + b (out may alias a) */
    void (*add)(void *ctx, dt_act *out, const dt_act *a, const dt_act *b, size_t n);

    /* Row-wise softmax + cross-entropy. probs(N,V) may alias logits(N,V); the rows of both (and
     * of dlogits below) are ld >= V elements apart, and only their first V are read or written.
     * losses(N) = -log probs[target]; rows with target < 0 are ignored (loss 0). */
    void (*xent_fwd)(void *ctx, float *losses, dt_act *probs, const dt_act *logits, const int *targets,
                     int N, int V, int ld);
    /* dlogits(N,V) = (probs - onehot(target)) * scale, 0 for ignored rows; may alias probs. */
    void (*xent_bwd)(void *ctx, dt_act *dlogits, const dt_act *probs, const int *targets, float scale,
                     int N, int V, int ld);
    /* May be NULL. Both at once, for training (no probabilities kept): losses(N) as xent_fwd and
     * dlogits(N,V) as xent_bwd would give them, in one pass over the rows; dlogits may alias
     * logits. With float activations rounded as the two calls round; with bf16 ones the
     * probabilities stay float until the gradient is stored (the two calls would round them to
     * bf16 in between, and lose p - 1 where p is near 1). */
    void (*xent_fused)(void *ctx, float *losses, dt_act *dlogits, const dt_act *logits, const int *targets,
                       float scale, int N, int V, int ld);

    /* May be NULL (tensor parallelism needs these four: the embedding table and the output head
     * split over the vocabulary, each share holding rows [v0, v0 + V) of wte).
     * encoder_part_fwd: encoder_fwd from those rows, a zero row for a token outside them (wpe
     * still added: NULL on all shares but one). encoder_part_bwd: encoder_bwd into them, tokens
     * outside them skipped.
     * xent_part_stats: of logits(N,V), columns [v0, v0 + V) of the whole rows, stats(N,4) = each
     * row's max m, sum in double of exp(x - m) (rounded to float), the target's logit where the
     * target is among these columns (else 0), and the column of the max (v0 + j, the first on
     * ties; as a float: exact below 2^24). xent_part_bwd: dlogits = (exp(x - lse) - onehot) *
     * scale from the whole rows' log-sum-exp lse(N), 0 for ignored rows; may alias logits. */
    void (*encoder_part_fwd)(void *ctx, dt_act *out, const int *tokens, const int *pos, const float *wte,
                             const float *wpe, int v0, int V, int B, int T, int C);
    void (*encoder_part_bwd)(void *ctx, float *dwte, float *dwpe, const dt_act *dout, const int *tokens, const int *pos,
                             int v0, int V, int B, int T, int C);
    void (*xent_part_stats)(void *ctx, float *stats, const dt_act *logits, const int *targets, int v0, int N, int V,
                            int ld);
    void (*xent_part_bwd)(void *ctx, dt_act *dlogits, const dt_act *logits, const float *lse, const int *targets, int v0,
                          float scale, int N, int V, int ld);

    /* idx(N) = index of the largest element of each row of x(N,V), rows ld >= V apart (the
     * first one on ties) */
    void (*argmax)(void *ctx, int *idx, const dt_act *x, int N, int V, int ld);

    /* out(n,C) = x[rows[i]] (pooling);  dx[rows[i]] += dout(n,C) */
    void (*gather_rows)(void *ctx, dt_act *out, const dt_act *x, const int *rows, int n, int C);
    void (*scatter_add_rows)(void *ctx, dt_act *dx, const dt_act *dout, const int *rows, int n, int C);

    /* AdamW as torch.optim.AdamW over n_pieces stretches (dt_adamw_piece) of p, g and m, v, in
     * one call (one launch on a GPU): m,v updated, bias correction with step t >= 1, decoupled
     * decay p -= lr * wd * p on the pieces marked decay. The same bits per element as one
     * stretch at a time. */
    void (*adamw)(void *ctx, float *p, const float *g, float *m, float *v, const dt_adamw_piece *pieces, int n_pieces,
                  float lr, float beta1, float beta2, float eps, float weight_decay, int t);
    /* *out (one double of backend memory) = the sum of squares in double of x over n_ranges
     * ranges (the global grad norm: all the gradients, or a shard's ranges), in one launch on a
     * GPU, the same bits on every run; the CPU adds each range's sum in order. Read it with
     * download_async. */
    void (*sumsq)(void *ctx, double *out, const float *x, const dt_range *ranges, int n_ranges);
    /* x *= s over n_ranges ranges (one launch on a GPU) */
    void (*scale)(void *ctx, float *x, const dt_range *ranges, int n_ranges, float s);
    /* *acc (one double of backend memory) += the sum in double of losses(n) over the rows whose
     * targets[i] >= 0 (targets NULL: every row): the training loss, kept on the device until the
     * step reads it once. The CPU adds the rows in order into a sum from 0, then that to *acc. */
    void (*loss_sum)(void *ctx, double *acc, const float *losses, const int *targets, int n);

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

#endif
