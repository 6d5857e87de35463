/* cudnn_att.h — causal self-attention through cuDNN's fused SDPA (flash attention), forward
 * and backward, bf16 in and out, fp32 statistics: the C interface of the CUDA backend's one C++
 * translation unit (cudnn_att.cpp, on the cuDNN frontend's graph API, which is C++ only).
 * Private to the CUDA backend (src/ops/ops_cuda.c).
 *
 * Layouts (row-major, as ops.h's attention, grouped-query): qkv(B,T,(NH+2NKV)HS) rows [q (NH
 * heads) | k (NKV heads) | v (NKV heads)], head h of each part at its columns h*HS..; query head
 * h reads key/value head h / (NH/NKV); out(B,T,NH*HS) heads side by side; stats(B,NH,T) the
 * softmax's log-sum-exp per row (what backward needs instead of the T x T probabilities); dqkv
 * like qkv (a key/value head's gradient sums its query heads'). cuDNN reads and writes them by
 * strides: no split or merge kernels, no repeated keys or values.
 *
 * cuDNN is opened with dlopen (libcudnn.so.<major it was built with>), as the backend opens
 * cuBLASLt; the frontend finds cuDNN's symbols through it and the CUDA runtime's through its own
 * dlopen (libcudart.so.<CUDA major dtrain was built with>: the shared runtime must be installed,
 * although dtrain itself links the runtime statically; without it no plan is made). Nothing here throws or exits: every failure returns non-zero with the reason in `why`. */
#ifndef DTRAIN_CUDNN_ATT_H
#define DTRAIN_CUDNN_ATT_H

#include <stddef.h>

#include <cuda_runtime.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dtc_att dtc_att;

/* An attention's shape: B sequences of T positions, NH query and NKV key/value heads (NH a
 * multiple of NKV) of HS features (ops.h dt_att_shape). packed 1: rows packed from several
 * examples (data.packing): forward and backward take a mask (B,T,T) bf16, its rows
 * DTC_MASK_LD(T) elements apart (16-byte aligned, as cuDNN wants its strides), that cuDNN adds
 * to the scaled scores before the causal mask and the softmax (its SDPA bias, broadcast over
 * the heads), 0 where a row may attend and a large negative number where not (kernels/dtk.h
 * dtk_att_example_mask); a plan of its own. */
#define DTC_MASK_LD(T) (((T) + 7) / 8 * 8)
typedef struct dtc_shape {
    int B, T, NH, NKV, HS;
    int packed;
} dtc_shape;

/* Loads cuDNN and makes a handle on stream s. NULL with the reason in why when cuDNN cannot be
 * loaded or initialised (no libcudnn, an older major, no usable GPU). */
dtc_att *dtc_att_open(cudaStream_t s, char *why, size_t n);
void dtc_att_close(dtc_att *a); /* accepts NULL */

/* Builds, or finds built, the forward plan for shape s, and with `backward` the backward plan
 * too (plans are cached per shape and direction; building is slow, running is not). 0: they exist, *ws is the largest workspace they need (bytes); -1:
 * cuDNN cannot run this shape here, why says what it refused. */
int dtc_att_plan(dtc_att *a, dtc_shape s, int backward, size_t *ws, char *why, size_t n);

/* out(B,T,NH*HS) and stats(B,NH,T) from qkv(B,T,(NH+2NKV)HS), bf16 (raw 16-bit) buffers,
 * scale 1/sqrt(HS); mask: s.packed's (B,T,T) bf16, else NULL; ws of at least dtc_att_plan's
 * bytes (backward 0). Plans the shape first when needed. 0, or -1 with why. */
int dtc_att_fwd(dtc_att *a, void *out, float *stats, const void *qkv, const void *mask, dtc_shape s, void *ws,
                size_t ws_bytes, char *why, size_t n);
/* dqkv(B,T,(NH+2NKV)HS) (overwritten) from dout(B,T,NH*HS), with qkv, mask, out and stats as
 * forward used and made them; ws of at least dtc_att_plan's bytes (backward 1). Deterministic.
 * 0, or -1 with why. */
int dtc_att_bwd(dtc_att *a, void *dqkv, const void *dout, const void *qkv, const void *mask, const void *out,
                const float *stats, dtc_shape s, void *ws, size_t ws_bytes, char *why, size_t n);

#ifdef __cplusplus
}
#endif

#endif
