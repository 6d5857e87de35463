// encoder.cu — token + position embedding (or the token's alone, without wpe): dtk_encoder_fwd
// and the deterministic dtk_encoder_bwd (dwpe, where there is one, summed over b in order; dwte
// through a stable sort of the tokens on the bits the vocabulary needs, so every dwte row adds its
// dout rows in increasing (b,t) order, as the CPU does; a long run of one token in pieces summed
// in parallel, then in a fixed order: see ENC_CHUNK).
#include <cub/device/device_radix_sort.cuh>
#include <limits.h>

#include "dtk.h"
#include "dtk_common.cuh"

// One block per (b,t) row, threads over the C columns; wpe NULL: the token embedding alone. The
// tables' element E: float, or bf16 (model.lora.base_dtype), widened as it is read. wte holds
// the rows [v0, v0 + V) of the vocabulary (tensor parallelism's share; all of it: 0, INT_MAX): a
// token outside them gives a zero row, its position still added.
template <typename A, typename E>
static __device__ void embed_rows(void *out, const int *tokens, const int *pos, const E *wte, const E *wpe, int v0, int V,
                                  int T, int C) {
    const int bt = blockIdx.x, t = pos ? pos[bt] : bt % T, k = tokens[bt] - v0;
    const E *e = k >= 0 && k < V ? wte + (size_t)k * C : nullptr, *p = wpe ? wpe + (size_t)t * C : nullptr;
    A *o = (A *)out + (size_t)bt * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float x = e ? dtk_ld(e, c) : 0.0f;
        dtk_st(o, c, p ? x + dtk_ld(p, c) : x);
    }
}
template <typename A>
static __device__ void encoder_fwd(void *out, const int *tokens, const int *pos, const float *wte, const float *wpe,
                                   int v0, int V, int T, int C) {
    embed_rows<A, float>(out, tokens, pos, wte, wpe, v0, V, T, C);
}
DTK_ACT_KERNELS(encoder_fwd,
                (void *out, const int *tokens, const int *pos, const float *wte, const float *wpe, int v0, int V, int T,
                 int C),
                (out, tokens, pos, wte, wpe, v0, V, T, C))

extern "C" cudaError_t dtk_encoder_part_fwd(cudaStream_t s, dtk_type t, void *out, const int *tokens, const int *pos,
                                            const float *wte, const float *wpe, int v0, int V, int B, int T, int C) {
    if (B <= 0 || T <= 0 || C <= 0) return cudaSuccess;
    if (t == DTK_BF16) dtk_encoder_fwd_bf16<<<B * T, DTK_THREADS, 0, s>>>(out, tokens, pos, wte, wpe, v0, V, T, C);
    else dtk_encoder_fwd_f32<<<B * T, DTK_THREADS, 0, s>>>(out, tokens, pos, wte, wpe, v0, V, T, C);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_encoder_fwd(cudaStream_t s, dtk_type t, void *out, const int *tokens, const int *pos,
                                       const float *wte, const float *wpe, int B, int T, int C) {
    return dtk_encoder_part_fwd(s, t, out, tokens, pos, wte, wpe, 0, INT_MAX, B, T, C);
}

// The same from bf16 tables (model.lora.base_dtype bf16): the sum in float, rounded once into
// the activation.
template <typename A>
static __device__ void encoder16_fwd(void *out, const int *tokens, const int *pos, const __nv_bfloat16 *wte,
                                     const __nv_bfloat16 *wpe, int v0, int V, int T, int C) {
    embed_rows<A, __nv_bfloat16>(out, tokens, pos, wte, wpe, v0, V, T, C);
}
DTK_ACT_KERNELS(encoder16_fwd,
                (void *out, const int *tokens, const int *pos, const __nv_bfloat16 *wte, const __nv_bfloat16 *wpe,
                 int v0, int V, int T, int C),
                (out, tokens, pos, wte, wpe, v0, V, T, C))

extern "C" cudaError_t dtk_encoder16_fwd(cudaStream_t s, dtk_type t, void *out, const int *tokens, const int *pos,
                                         const dtk_bf16 *wte, const dtk_bf16 *wpe, int v0, int V, int B, int T, int C) {
    if (B <= 0 || T <= 0 || C <= 0) return cudaSuccess;
    if (t == DTK_BF16)
        dtk_encoder16_fwd_bf16<<<B * T, DTK_THREADS, 0, s>>>(out, tokens, pos, wte, wpe, v0, V, T, C);
    else dtk_encoder16_fwd_f32<<<B * T, DTK_THREADS, 0, s>>>(out, tokens, pos, wte, wpe, v0, V, T, C);
    return cudaGetLastError();
}

// dwpe[t,c] += dout[0,t,c] + dout[1,t,c] + ... in increasing b. With tc = t*C + c the
// element of batch b is dout[b*T*C + tc].
template <typename A> static __device__ void dwpe_sum(float *dwpe, const void *dout_, int B, size_t TC) {
    const A *dout = (const A *)dout_;
    for (size_t tc = (size_t)blockIdx.x * blockDim.x + threadIdx.x; tc < TC; tc += (size_t)gridDim.x * blockDim.x) {
        float acc = dwpe[tc];
        for (int b = 0; b < B; b++) acc += dtk_ld(dout, (size_t)b * TC + tc);
        dwpe[tc] = acc;
    }
}
DTK_ACT_KERNELS(dwpe_sum, (float *dwpe, const void *dout, int B, size_t TC), (dwpe, dout, B, TC))

// Packed rows: each example's length, written at its first row (len's other rows are left as
// they are): an example's last row v (the sequence's last, or the next row starts another, at
// position 0) writes pos[v] + 1 at v - pos[v]. Every sequence starts an example at row 0.
static __global__ void dtk_example_lens(int *len, const int *pos, int B, int T) {
    const size_t BT = (size_t)B * T;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < BT; i += (size_t)gridDim.x * blockDim.x)
        if ((int)(i % T) == T - 1 || pos[i + 1] == 0) len[i - pos[i]] = pos[i] + 1;
}

// dwpe[p,c] += the dout rows at position p, in increasing (b,t) (the CPU's order): row s + p of
// each example starting at s that is longer than p, the examples walked by their lengths (len:
// dtk_example_lens), E of them a sequence instead of its T rows. A warp's threads share p (C >=
// 32 columns apart or the same row), so their reads of len coincide.
template <typename A>
static __device__ void dwpe_sum_packed(float *dwpe, const void *dout_, const int *len, int B, int T, int C) {
    const A *dout = (const A *)dout_;
    const size_t TC = (size_t)T * C;
    for (size_t tc = (size_t)blockIdx.x * blockDim.x + threadIdx.x; tc < TC; tc += (size_t)gridDim.x * blockDim.x) {
        const int p = (int)(tc / C), c = (int)(tc % C);
        float acc = dwpe[tc];
        for (int b = 0; b < B; b++)
            for (int s = 0, n; s < T; s += n) {
                n = len[(size_t)b * T + s];
                if (p < n) acc += dtk_ld(dout, ((size_t)b * T + s + p) * C + c);
            }
        dwpe[tc] = acc;
    }
}
DTK_ACT_KERNELS(dwpe_sum_packed, (float *dwpe, const void *dout, const int *len, int B, int T, int C),
                (dwpe, dout, len, B, T, C))

static __global__ void dtk_iota_kernel(int *x, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = i;
}

// Long runs of one token (the pad token of a classifier's batch: thousands of positions) are
// summed in pieces. The sorted positions fall into chunks of ENC_CHUNK; a chunk whose positions
// all hold one token ("whole": its first and last keys equal, the keys being sorted) is summed on
// its own, in parallel with the others, into a partial row (dwte_chunks); then the first
// position of each run adds, in sorted order, its rows before its first whole chunk one at a
// time, each whole chunk's partial, and its rows after the last one at a time (dwte_runs). The
// order is fixed (whatever the blocks' schedule), so every call gives the same bits; but a run
// that covers a whole chunk is added in another order than the CPU's serial one (they differ by
// rounding: the fp32 test's 3e-5 for long reductions), while a shorter run is added exactly as
// the CPU adds it. Serial work a run: at most 2 * ENC_CHUNK rows and one partial a whole chunk.
#define ENC_CHUNK 64

// keys: the tokens sorted (stable); idx: their original (b,t) positions. Block x sums chunk x
// (positions [x*ENC_CHUNK, (x+1)*ENC_CHUNK), all within BT) into part row x when it is whole;
// threads over columns, strided over grid.y.
template <typename A>
static __device__ void dwte_chunks(float *part, const void *dout_, const unsigned *keys, const int *idx, int C) {
    const A *dout = (const A *)dout_;
    const int i0 = blockIdx.x * ENC_CHUNK;
    if (keys[i0] != keys[i0 + ENC_CHUNK - 1]) return; // not whole: dwte_runs adds its rows one by one
    float *p = part + (size_t)blockIdx.x * C;
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < C; c += gridDim.y * blockDim.x) {
        float acc = 0.0f;
        for (int j = i0; j < i0 + ENC_CHUNK; j++) acc += dtk_ld(dout, (size_t)idx[j] * C + c);
        p[c] = acc;
    }
}
DTK_ACT_KERNELS(dwte_chunks, (float *part, const void *dout, const unsigned *keys, const int *idx, int C),
                (part, dout, keys, idx, C))

// Block x looks at sorted position i; only the first position of a run of equal tokens does
// work: its threads (columns, strided over grid.y) add the run into the token's dwte row in
// sorted order, which the stable sort made increasing (b,t) order: a whole chunk (the same test
// as dwte_chunks') as its partial, any other position as its dout row. The run of key `skip`
// (tokens outside a share's rows) adds nothing.
template <typename A>
static __device__ void dwte_runs(float *dwte, const float *part, const void *dout_, const unsigned *keys,
                                 const int *idx, int BT, int C, unsigned skip) {
    const A *dout = (const A *)dout_;
    const int i = blockIdx.x;
    const unsigned tok = keys[i];
    if ((i > 0 && keys[i - 1] == tok) || tok == skip) return;
    float *d = dwte + (size_t)tok * C;
    for (int c = blockIdx.y * blockDim.x + threadIdx.x; c < C; c += gridDim.y * blockDim.x) {
        float acc = d[c];
        for (int j = i; j < BT && keys[j] == tok;) {
            if (j % ENC_CHUNK == 0 && j + ENC_CHUNK <= BT && keys[j + ENC_CHUNK - 1] == tok) {
                acc += part[(size_t)(j / ENC_CHUNK) * C + c];
                j += ENC_CHUNK;
            } else {
                acc += dtk_ld(dout, (size_t)idx[j] * C + c);
                j++;
            }
        }
        d[c] = acc;
    }
}
DTK_ACT_KERNELS(dwte_runs,
                (float *dwte, const float *part, const void *dout, const unsigned *keys, const int *idx, int BT, int C,
                 unsigned skip),
                (dwte, part, dout, keys, idx, BT, C, skip))

// A share's sort keys: token - v0 for the tokens in [v0, v0 + V), V (sorted last, skipped) for
// the others.
static __global__ void dtk_share_keys(unsigned *keys, const int *tokens, int v0, int V, int BT) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < BT; i += gridDim.x * blockDim.x) {
        const int k = tokens[i] - v0;
        keys[i] = k >= 0 && k < V ? (unsigned)k : (unsigned)V;
    }
}

// The key bits that order tokens in [0, V): ceil(log2 V), at least 1; all 32 when V is not
// known (<= 0). Fewer bits, fewer radix passes (GPT-2's 50257 tokens: 16 bits, 2 passes of 8).
static int key_bits(int V) {
    if (V <= 0) return 32;
    int bits = 1;
    while (bits < 32 && ((unsigned)(V - 1) >> bits) != 0) bits++;
    return bits;
}

// CUB's scratch for sorting n (unsigned key, int value) pairs by key bits [0, bits); asks the
// runtime for the device's PTX version (no GPU work). 0 on failure. It grows with the bits (the
// passes' histograms), so the size for 32 bits covers every V.
static size_t sort_temp_bytes(int n, int bits) {
    size_t bytes = 0;
    if (cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const unsigned *)nullptr, (unsigned *)nullptr,
                                        (const int *)nullptr, (int *)nullptr, n, 0, bits) != cudaSuccess)
        return 0;
    return bytes;
}

// work = [a share's keys | sorted keys | positions (iota) | sorted positions | whole chunks'
// partial rows (BT / ENC_CHUNK of C floats) | CUB scratch], each 256-aligned
static size_t part_bytes(int BT, int C) { return dtk_align((size_t)(BT / ENC_CHUNK) * (size_t)C * sizeof(float)); }

extern "C" size_t dtk_encoder_bwd_work_bytes(int B, int T, int C) {
    if (B <= 0 || T <= 0 || C <= 0) return 0;
    const int BT = B * T;
    const size_t temp = sort_temp_bytes(BT, 32);
    if (temp == 0) return 0;
    return 4 * dtk_align((size_t)BT * sizeof(int)) + part_bytes(BT, C) + dtk_align(temp);
}

// The backward from sort keys `in` (BT, below 2^bits; the run of key `skip` left out) into the
// rows of dwte they name.
static cudaError_t encoder_bwd(cudaStream_t s, dtk_type t, float *dwte, float *dwpe, const void *dout, const unsigned *in,
                               const int *rowpos, int B, int T, int C, int bits, unsigned skip, void *work,
                               size_t work_bytes) {
    const int BT = B * T;
    const size_t arr = dtk_align((size_t)BT * sizeof(int)), off = 4 * arr + part_bytes(BT, C);
    const size_t temp = sort_temp_bytes(BT, bits);
    if (temp == 0 || work == nullptr || work_bytes < off || work_bytes - off < temp) return cudaErrorInvalidValue;
    char *w = (char *)work + arr; /* the first array: dtk_encoder_part_bwd's keys */
    unsigned *keys = (unsigned *)w;
    int *pos = (int *)(w + arr), *idx = (int *)(w + 2 * arr);
    float *part = (float *)(w + 3 * arr);
    void *cub_temp = (char *)work + off;
    size_t cub_bytes = work_bytes - off;

    const size_t TC = (size_t)T * C;
    cudaError_t e;
    if (dwpe && rowpos) { /* the examples' lengths in pos (the iota below takes it over after) */
        dtk_example_lens<<<dtk_blocks((size_t)BT), DTK_THREADS, 0, s>>>(pos, rowpos, B, T);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
        if (t == DTK_BF16) dtk_dwpe_sum_packed_bf16<<<dtk_blocks(TC), DTK_THREADS, 0, s>>>(dwpe, dout, pos, B, T, C);
        else dtk_dwpe_sum_packed_f32<<<dtk_blocks(TC), DTK_THREADS, 0, s>>>(dwpe, dout, pos, B, T, C);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    } else if (dwpe) { // no learned positions (wpe NULL): nothing to add
        if (t == DTK_BF16) dtk_dwpe_sum_bf16<<<dtk_blocks(TC), DTK_THREADS, 0, s>>>(dwpe, dout, B, TC);
        else dtk_dwpe_sum_f32<<<dtk_blocks(TC), DTK_THREADS, 0, s>>>(dwpe, dout, B, TC);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    dtk_iota_kernel<<<dtk_blocks((size_t)BT), DTK_THREADS, 0, s>>>(pos, BT);
    if ((e = cudaGetLastError()) != cudaSuccess) return e;
    // SortPairs is a stable LSD radix sort: equal keys keep increasing positions.
    e = cub::DeviceRadixSort::SortPairs(cub_temp, cub_bytes, in, keys, pos, idx, BT, 0, bits, s);
    if (e != cudaSuccess) return e;
    const unsigned col_blocks = (unsigned)((C + DTK_THREADS - 1) / DTK_THREADS);
    const unsigned cy = col_blocks < 65535u ? col_blocks : 65535u;
    if (BT >= ENC_CHUNK) {
        const dim3 grid((unsigned)(BT / ENC_CHUNK), cy);
        if (t == DTK_BF16) dtk_dwte_chunks_bf16<<<grid, DTK_THREADS, 0, s>>>(part, dout, keys, idx, C);
        else dtk_dwte_chunks_f32<<<grid, DTK_THREADS, 0, s>>>(part, dout, keys, idx, C);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    const dim3 grid((unsigned)BT, cy);
    if (t == DTK_BF16) dtk_dwte_runs_bf16<<<grid, DTK_THREADS, 0, s>>>(dwte, part, dout, keys, idx, BT, C, skip);
    else dtk_dwte_runs_f32<<<grid, DTK_THREADS, 0, s>>>(dwte, part, dout, keys, idx, BT, C, skip);
    return cudaGetLastError();
}

extern "C" cudaError_t dtk_encoder_bwd(cudaStream_t s, dtk_type t, float *dwte, float *dwpe, const void *dout,
                                       const int *tokens, const int *rowpos, int B, int T, int C, int V, void *work,
                                       size_t work_bytes) {
    if (B <= 0 || T <= 0 || C <= 0) return cudaSuccess;
    // Tokens are in [0, V), so they read as unsigned with the same bits, all below bit key_bits(V).
    return encoder_bwd(s, t, dwte, dwpe, dout, (const unsigned *)tokens, rowpos, B, T, C, key_bits(V), UINT_MAX, work,
                       work_bytes);
}

extern "C" cudaError_t dtk_encoder_part_bwd(cudaStream_t s, dtk_type t, float *dwte, float *dwpe, const void *dout,
                                            const int *tokens, const int *rowpos, int v0, int V, int B, int T, int C,
                                            void *work, size_t work_bytes) {
    if (B <= 0 || T <= 0 || C <= 0) return cudaSuccess;
    if (V <= 0 || work == nullptr) return cudaErrorInvalidValue;
    const int BT = B * T;
    unsigned *in = (unsigned *)work;
    dtk_share_keys<<<dtk_blocks((size_t)BT), DTK_THREADS, 0, s>>>(in, tokens, v0, V, BT);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    return encoder_bwd(s, t, dwte, dwpe, dout, in, rowpos, B, T, C, key_bits(V + 1), (unsigned)V, work, work_bytes);
}
