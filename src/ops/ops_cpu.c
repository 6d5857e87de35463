/* ops_cpu.c — the CPU backend (include/dtrain/ops.h): oneDNN, OpenBLAS and OpenMP, activations
 * in fp32.
 *
 * A weight product of 256 rows or more is one oneDNN matmul a tile (gemm32; OpenBLAS's sgemm in a
 * build without oneDNN, on a CPU without AVX2, or under DTRAIN_CPU_GEMM=openblas); every other
 * matmul (fewer rows, the attention, LoRA's thin products) is one or a few cblas_sgemm calls
 * (OpenBLAS, OpenMP build); everything else is a plain loop parallelised with OpenMP over rows,
 * heads or column chunks. Attention runs one (batch, head) per OpenMP iteration; inside a parallel
 * region the OpenMP build of OpenBLAS runs single-threaded, so the two never oversubscribe.
 *
 * Numerics follow DESIGN.md §4. Reductions whose order could depend on the thread count
 * (encoder_bwd, bias and LayerNorm weight gradients, scatter_add_rows, sumsq) are written
 * so that it does not: their results are bit-identical for any number of threads. So are the
 * matmuls: OpenBLAS's own threading is not (on AMD EPYC, 0.3.21, a product's values change with
 * the thread count), so each is split into tiles of the result sized by the shape alone
 * (gemm_plan), one single-threaded sgemm or oneDNN primitive each, run in parallel by OpenMP
 * (jobs_run: a backward's input and weight gradients and bias sums in one parallel region, each
 * tile on whichever thread is free, the same values on any).
 * exp (softmax, cross-entropy, GELU, SiLU) is an inlined polynomial (fast_expf, ~2e-7 relative)
 * so that those loops vectorize; GELU uses the exact identity 0.5(1 + tanh u) = 1/(1 + e^-2u).
 *
 * training.precision bf16 (where the CPU has AVX512-BF16 or AMX): the weight products take their
 * inputs rounded to bf16 and accumulate in fp32, through oneDNN's matmul on the same tiles
 * (gemm16), and so do the attention's products where its heads and sequences are large enough
 * (att16_fwd, att16_bwd: one oneDNN primitive a block, on the head's thread); everything else
 * stays as above.
 *
 * This backend is the reference the CUDA ops are tested against; it allocates nothing after
 * init except through alloc, and oneDNN's primitives with their per-thread scratchpads and, with
 * bf16 products, the bf16 copies of a product's inputs (made, or grown, the first time a shape
 * comes: with data.pad_to longest, a few lengths of rows each bring theirs). */
#include "dtrain/ops.h"

#include "dtrain/bf16.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef DT_HAVE_DNNL
#include <oneapi/dnnl/dnnl.h>
#endif

#ifdef DT_HAVE_DNNL
/* one oneDNN matmul: C(m,n) (+)= op(A)(m,k) op(B)(k,n), A and B fp32 (f32) or bf16, stored
 * transposed or not with rows lda and ldb apart, C fp32 with rows ldc apart; made for one thread
 * (see mm_get); prim NULL where oneDNN refused the shape */
typedef struct mm16 {
    int f32, m, n, k, a_trans, b_trans, lda, ldb, ldc, acc;
    dnnl_primitive_t prim;
    size_t scratch; /* bytes of its scratchpad (user-managed: one per thread) */
} mm16;
#define MM16_MAX 256 /* primitives kept: a model's products come in a few dozen shapes, its attention's
                      in up to 77 more (mm_room, att16_prepare) */
#endif

typedef struct cpu_ctx {
    int threads;  /* as opened with; <= 0: library defaults */
    float *panel; /* model.lora.base_dtype bf16: a piece of a bf16 weight widened (reserve), panel_n floats */
    size_t panel_n;
    int bf16;     /* training.precision bf16: matmul_fwd/bwd's products with bf16 inputs (gemm16) */
    int f32dnnl;  /* fp32 weight products through oneDNN (gemm32) */
    uint16_t *a16, *b16; /* bf16 (oneDNN): a product's inputs rounded, a16_n and b16_n elements */
    size_t a16_n, b16_n;
    uint16_t *c16; /* ... and a weight gradient's input (cpu_matmul_bwd), c16_n elements */
    size_t c16_n;
#ifdef DT_HAVE_DNNL
    dnnl_engine_t eng;
    int slots;               /* threads the streams and scratchpads below serve */
    dnnl_stream_t *streams;  /* one per thread */
    unsigned char **scratch; /* one per thread, scratch_n bytes each */
    size_t scratch_n;
    mm16 mm[MM16_MAX];
    int n_mm;
#endif
} cpu_ctx;

#define ALIGN 64          /* alloc alignment (one cache line, AVX-512 friendly) */
#define PAR_MIN 16384     /* loops touching fewer elements than this stay on one thread */
#define COL_CHUNK 16      /* columns per task in column-parallel reductions */
#define COLSUM_WIDE 64    /* ... or this many, where that still makes 4 tasks (col_width) */
#define ATT_BLK 64        /* attention query/key block; blocks above the diagonal are skipped */
#define SUMSQ_CHUNKS 64   /* fixed partition of sumsq, independent of the thread count */
#define SUMSQ_LANES 4     /* ... whose chunks' sums a task advances side by side (sumsq_lanes) */
_Static_assert(SUMSQ_CHUNKS % SUMSQ_LANES == 0, "sumsq's tasks take whole groups of chunks");
#define DT_STR(x) #x
#define DT_UNROLL(n) _Pragma(DT_STR(GCC unroll n)) /* n macro-expanded first, as #pragma's is not */
#define LN_EPS 1e-5f
#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define EW_CHUNK 8192     /* elements per task in elementwise loops */
#define GEMM_TILE 256     /* the matmuls' tiles of C have at least this many rows, and columns (half */
#define GEMM_TILES 16     /* as many where C has GEMM_TILE rows or more); at most this many tiles, */
#define GEMM_MIN_TILES 4  /* and columns are split until there are this many (gemm_plan) */
#define GEMM_GRAD_ROWS 64 /* an OpenBLAS weight gradient of this many rows or more that would be one tile */
#define GEMM_GRAD_COLS 32 /* ... is split into columns of at least this many (gemm_plan) */
#define GEMM_LONG_K 8192  /* a sum this long over a row of A (a head's input gradient) wants twice as many */
#define PANEL ((size_t)1 << 20) /* a bf16 weight is widened for its products in pieces of at most this
                                   many floats (4 MiB), whole columns of the output each */
#define GEMM_WIDE_B ((size_t)1 << 22) /* a B of this many floats (16 MiB) and more than twice as many
                                         columns as C has rows (the head's forward: V columns) is
                                         split into tiles of columns only: every tile of rows
                                         would pack all of B again (1.75x the time at V 50257) */

/* The compute-bound row/range kernels below are compiled three times (AVX-512, AVX2,
 * baseline) and the loader picks one for the CPU (GCC/Clang function multiversioning):
 * the project builds for baseline x86-64, where they would run on 4-wide SSE. */
#if defined(__x86_64__) && defined(__linux__) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define DT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif
#endif
#ifndef DT_CLONES
#define DT_CLONES
#endif

static inline int imin(int a, int b) { return a < b ? a : b; }
/* elementwise loops over n elements: tasks of EW_CHUNK, [c * EW_CHUNK, ew_end(c, n)) */
static inline size_t ew_tasks(size_t n) { return (n + EW_CHUNK - 1) / EW_CHUNK; }
static inline size_t ew_end(size_t c, size_t n) { return (c + 1) * EW_CHUNK < n ? (c + 1) * EW_CHUNK : n; }
static inline int imax(int a, int b) { return a > b ? a : b; }
/* a weight product over M rows of the batch (a forward's or input gradient's rows of output, a
 * weight gradient's sum) runs with bf16 inputs (gemm16, unless oneDNN refuses it):
 * training.precision bf16 and GEMM_TILE rows or more */
static inline int runs16(const cpu_ctx *cx, int M) { return cx->bf16 && M >= GEMM_TILE; }

/* exp(x), relative error ~2e-7 (Cephes polynomial on [-ln2/2, ln2/2], then scaling by 2^n
 * through the exponent bits). Unlike libm's expf it inlines, so the loops that call it
 * vectorize; gelu, softmax and cross-entropy spend most of their time here. Inputs are
 * clamped to [-86, 88]: below, the result is ~4e-38 instead of smaller (harmless next to
 * the 1 that softmax and gelu add it to); above, float would overflow anyway; NaN is
 * clamped too, callers never pass one on valid inputs. */
static inline float fast_expf(float x) {
    /* the clamp works on the bits: float compares would keep GCC from if-converting the
     * loop under -ftrapping-math (the default), and so from vectorizing it */
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (int32_t)u > 0x42b00000 ? 0x42b00000u : u; /* x > 88 (or +NaN): 88 */
    u = u > 0xc2ac0000u ? 0xc2ac0000u : u;         /* x < -86 (or -NaN): -86 */
    memcpy(&x, &u, sizeof x);
    const float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round(x/ln2) */
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f; /* ln2 = 0.693359375 - 2.12194440e-4 */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += (int32_t)n * (1 << 23);
    memcpy(&p, &bits, sizeof p);
    return p;
}

/* ---- memory ---- */

static dt_status cpu_alloc(void *ctx, size_t bytes, const char *what, void **out) {
    (void)ctx;
    *out = NULL;
    /* aligned_alloc wants a multiple of the alignment; 0 bytes still gets a valid block */
    const size_t rounded = bytes ? (bytes + (ALIGN - 1)) & ~(size_t)(ALIGN - 1) : ALIGN;
    void *p = bytes <= SIZE_MAX - (ALIGN - 1) ? aligned_alloc(ALIGN, rounded) : NULL;
    if (!p)
        return dt_error_set(DT_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes,
                            what ? what : "(unnamed buffer)");
    memset(p, 0, rounded);
    *out = p;
    return DT_OK;
}

static void cpu_free(void *ctx, void *p) { (void)ctx; free(p); }

static void cpu_memcpy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (bytes) memcpy(dst, src, bytes);
}

/* inside a parallel region: the calling thread's stretch [lo, hi) of n items cut into one
 * stretch a thread, cuts at multiples of align, the last thread's running to n */
static void thread_stretch(size_t n, size_t align, size_t *lo, size_t *hi) {
    const size_t nth = (size_t)omp_get_num_threads(), me = (size_t)omp_get_thread_num();
    *lo = n / nth * me / align * align;
    *hi = me + 1 == nth ? n : n / nth * (me + 1) / align * align;
}

/* large buffers (the gradients before a step's backward) are cleared by every thread, a stretch
 * each: one core alone does not reach the memory's bandwidth */
static void cpu_zero(void *ctx, void *p, size_t bytes) {
    (void)ctx;
    if (bytes < PAR_MIN * sizeof(float)) { /* a step's few small ones: no parallel region */
        if (bytes) memset(p, 0, bytes);
        return;
    }
#pragma omp parallel
    {
        size_t lo, hi;
        thread_stretch(bytes, 64, &lo, &hi);
        if (hi > lo) memset((char *)p + lo, 0, hi - lo);
    }
}

/* The columns a task of a column reduction takes: COLSUM_WIDE where that still makes 4 tasks,
 * else COL_CHUNK. Each column adds its rows in order either way (the same bits); wider tasks run
 * more independent double adds a row (a bias gradient of 2048 x 768: 241 -> 190 us). */
static int col_width(int N) { return N >= 4 * COLSUM_WIDE ? COLSUM_WIDE : COL_CHUNK; }

/* dst[c0, c0 + nc) += the column sums of src(M, those columns) (rows ld apart), each column's
 * rows added in order in double: a bias gradient's chunk of columns (JOB_COLSUM), the same bits
 * on any thread */
DT_CLONES
static void colsum_chunk(float *dst, const float *src, int M, int ld, int c0, int nc) {
    double acc[COLSUM_WIDE] = {0};
    for (int i = 0; i < M; i++) {
        const float *row = src + (size_t)i * ld + c0;
#pragma omp simd
        for (int j = 0; j < nc; j++) acc[j] += row[j];
    }
    for (int j = 0; j < nc; j++) dst[c0 + j] += (float)acc[j];
}

static int pow2_floor(int n) { /* the largest power of two <= n, for n >= 1 */
    int p = 1;
    while (2 * p <= n) p *= 2;
    return p;
}

/* C(M,N) = alpha op(A)(M,K) op(B)(K,N) + beta C (row-major), as tiles of C chosen by the shape
 * alone. OpenBLAS packs all of B again for every tile of rows and all of A for every tile of
 * columns, so tiles are large: blocks of at least GEMM_TILE rows, a power of two of them up to
 * GEMM_TILES; then, if that makes fewer than GEMM_MIN_TILES, blocks of at least GEMM_TILE / 2
 * columns too (so that a weight gradient of 256 x 256 is two tiles, not one thread's work), or
 * until twice as many with PLAN_LONG_K and K of GEMM_LONG_K or more: oneDNN's products whose A is
 * not transposed (a head's input gradient sums over the vocabulary: its fp32 tiles of 256 x 576
 * ran at 195 GFLOP/s, of 256 x 288 at 220; a weight gradient's sum over many tokens, A transposed,
 * was not measured and keeps the plan; OpenBLAS, which would pack A once more a tile, lost 3%).
 * When A is small next to B (fewer than GEMM_TILE rows: generation's single token, LoRA's thin
 * products; or a wide B, GEMM_WIDE_B, which is split by columns only) packing A again costs
 * little, and columns are split, in blocks of at least GEMM_TILE, up to GEMM_TILES tiles.
 * PLAN_GRAD, OpenBLAS's weight gradients (op(A) = A^T, a sum over the tokens): one that this
 * leaves one tile of GEMM_GRAD_ROWS rows or more is split into columns of at least
 * GEMM_GRAD_COLS, up to GEMM_MIN_TILES tiles (the shipped fine-tune's 64-row weight gradients
 * were one thread's work at half the other products' rate; in these tiles OpenBLAS gave the
 * fine-tune the same bits, scripts/same-weights.sh). oneDNN's keep their plan: its smaller tiles,
 * of rows or of columns, changed the fine-tune's bits.
 * Power-of-two counts share out evenly over 2, 4, 8 or 16 threads. One sgemm or oneDNN primitive
 * a tile, single-threaded inside the parallel region (OpenBLAS's OpenMP build), so every value is
 * computed the same way for any number of threads.
 * (docs/PERFORMANCE.md: 64-row tiles spent a fifth of a SmolLM2 step packing.) */
enum { PLAN_LONG_K = 1, PLAN_GRAD = 2 };
static void gemm_plan(int M, int N, int K, int flags, int *rows_, int *nr_, int *cols_, int *nc_) {
    const int wide = (size_t)K * N >= GEMM_WIDE_B && N > 2 * M; /* B much the larger: tiles of columns only */
    int nr = wide ? 1 : imin(pow2_floor(imax(M / GEMM_TILE, 1)), GEMM_TILES);
    const int rows = nr == 1 ? M : ((M + nr - 1) / nr + 15) / 16 * 16;
    nr = (M + rows - 1) / rows;
    const int thin = wide || M < GEMM_TILE; /* A small next to B: columns up to GEMM_TILES tiles */
    const int want = thin ? GEMM_TILES : (flags & PLAN_LONG_K) && K >= GEMM_LONG_K ? 2 * GEMM_MIN_TILES : GEMM_MIN_TILES;
    const int mincols = thin ? GEMM_TILE : GEMM_TILE / 2;
    int ncb = imin(pow2_floor(imax(N / mincols, 1)), imax(want / nr, 1));
    if ((flags & PLAN_GRAD) && nr == 1 && ncb == 1 && M >= GEMM_GRAD_ROWS) /* one thread's work */
        ncb = imin(pow2_floor(imax(N / GEMM_GRAD_COLS, 1)), GEMM_MIN_TILES);
    const int cols = ncb == 1 ? N : ((N + ncb - 1) / ncb + 15) / 16 * 16, nc = (N + cols - 1) / cols;
    *rows_ = rows, *nr_ = nr, *cols_ = cols, *nc_ = nc;
}

/* ---- jobs: products' tiles and bias sums, run together ----
 * A job is one product's tiles of C(M,N) (gemm_plan's), ready to run: each tile one
 * single-threaded cblas_sgemm (JOB_BLAS) or oneDNN primitive (JOB_DNNL: the primitives made,
 * and with bf16 the inputs' copies rounded, when the job is made); or a bias gradient's chunks
 * of columns (JOB_COLSUM, colsum_chunk). jobs_run runs the tasks of a few jobs in one parallel
 * region, the larger tiles first, each on whichever thread takes it next. A task's values do not
 * depend on its thread (a tile is single-threaded, its primitive made for one thread; a chunk
 * adds its rows in order), so they are those of the jobs run one after another, on any number
 * of threads; a backward's input gradient, weight gradient and bias sums share the threads
 * (a weight gradient that is one tile does not leave the others waiting). */
enum { JOB_BLAS, JOB_DNNL, JOB_COLSUM };
typedef struct job {
    int kind;
    int rows, nr, cols, nc; /* tiles of C: nr x nc of rows x cols (JOB_COLSUM: nc chunks of cols, nr 1) */
    int M, N, K;
    CBLAS_TRANSPOSE ta, tb;
    float alpha, beta;
    const void *A, *B; /* JOB_DNNL: el bytes an element (fp32 or bf16), as laid out for its primitives */
    float *C;
    int lda, ldb, ldc, el;
#ifdef DT_HAVE_DNNL
    const mm16 *p[4]; /* JOB_DNNL: the primitives of a full tile, the last row's and column's (tiles_get) */
#endif
} job;
#define JOBS_MAX 4

/* C(M,N) = alpha op(A) op(B) + beta C as OpenBLAS tiles */
static void job_blas(job *j, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    *j = (job){.kind = JOB_BLAS, .M = M, .N = N, .K = K, .ta = ta, .tb = tb, .alpha = alpha, .beta = beta,
               .A = A, .B = B, .C = C, .lda = lda, .ldb = ldb, .ldc = ldc};
    gemm_plan(M, N, K, ta == CblasNoTrans ? 0 : PLAN_GRAD, &j->rows, &j->nr, &j->cols, &j->nc);
}

/* dst(N) += the column sums of src(M,N) (rows ld apart), chunks of col_width(N) columns */
static void job_colsum(job *j, float *dst, const float *src, int M, int N, int ld) {
    const int w = col_width(N);
    *j = (job){.kind = JOB_COLSUM, .M = M, .N = N, .A = src, .C = dst, .lda = ld, .rows = M, .nr = 1, .cols = w,
               .nc = (N + w - 1) / w};
}

#ifdef DT_HAVE_DNNL
/* ---- bf16 products (training.precision: bf16): oneDNN's matmul, on AMX or AVX512-BF16 ----
 * A product's inputs are rounded to bf16 (to nearest even, as dt_float_to_bf16) into dense
 * copies, laid out as the fp32 operands are (a transposed A, a weight gradient's, stays
 * transposed: oneDNN reads it so), and multiplied with fp32 accumulation into its fp32 output, in
 * the fp32 products' tiles (gemm_plan, jobs_run), each tile one primitive made for one thread and
 * run on the thread of its tile, so the values do not depend on the thread count. Products over
 * fewer than GEMM_TILE rows of the batch (runs16), and any that oneDNN refuses, run in fp32
 * (fp32_gemm). The copies (the largest product's inputs in bf16, and the largest input of a
 * weight gradient) and oneDNN's per-thread scratchpads are this mode's extra memory. */

/* *buf holds at least want elements of size el (grown, 64-byte aligned; contents not kept) */
static int grow(void **buf, size_t *n, size_t want, size_t el) {
    if (want <= *n) return 1;
    void *p = NULL;
    if (posix_memalign(&p, ALIGN, want * el)) return 0;
    free(*buf);
    *buf = p;
    *n = want;
    return 1;
}

/* dst(rows, cols), dense = bf16 of src(rows, cols) with rows ld apart */
static void pack16(uint16_t *dst, const float *src, int rows, int cols, int ld) {
#pragma omp parallel for schedule(static) if ((size_t)rows * cols >= PAR_MIN)
    for (int i = 0; i < rows; i++) dt_bf16_pack(dst + (size_t)i * cols, src + (size_t)i * ld, (size_t)cols);
}

/* Room for `want` more primitives in the table: when it is short, all are dropped (generation's
 * growing products can come in hundreds of shapes). Never a fallback to OpenBLAS instead, so which
 * library runs a product does not depend on what ran before (a resumed run gives the same bits). */
static void mm_room(cpu_ctx *cx, int want) {
    if (cx->n_mm + want <= MM16_MAX) return;
    for (int i = 0; i < cx->n_mm; i++)
        if (cx->mm[i].prim) dnnl_primitive_destroy(cx->mm[i].prim);
    cx->n_mm = 0;
}

/* the table's entry for C(m,n) (+ C when acc) = op(A)(m,k) op(B)(k,n), made on first use (the
 * caller made room, mm_room); its prim is NULL where oneDNN refuses the shape or has only its
 * reference loops for it. Made with OpenMP's thread count at 1: oneDNN plans a primitive's work
 * for the threads it sees then, and each runs inside one tile's thread. */
static const mm16 *mm_find(const cpu_ctx *cx, int f32, int m, int n, int k, int a_trans, int b_trans, int lda,
                           int ldb, int ldc, int acc) {
    for (int i = 0; i < cx->n_mm; i++) {
        const mm16 *p = &cx->mm[i];
        if (p->m == m && p->n == n && p->k == k && p->f32 == f32 && p->a_trans == a_trans && p->b_trans == b_trans &&
            p->lda == lda && p->ldb == ldb && p->ldc == ldc && p->acc == acc)
            return p;
    }
    return NULL;
}

static const mm16 *mm_get(cpu_ctx *cx, int f32, int m, int n, int k, int a_trans, int b_trans, int lda, int ldb,
                          int ldc, int acc) {
    const mm16 *found = mm_find(cx, f32, m, n, k, a_trans, b_trans, lda, ldb, ldc, acc);
    if (found) return found;
    dnnl_memory_desc_t a, b, c;
    dnnl_dims_t ad = {m, k}, bd = {k, n}, cd = {m, n};
    dnnl_dims_t as = {a_trans ? 1 : lda, a_trans ? lda : 1}, bs = {b_trans ? 1 : ldb, b_trans ? ldb : 1},
                cs = {ldc, 1};
    const dnnl_data_type_t in = f32 ? dnnl_f32 : dnnl_bf16;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_primitive_t prim = NULL;
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    int ok = dnnl_memory_desc_init_by_strides(&a, 2, ad, in, as) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&b, 2, bd, in, bs) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&c, 2, cd, dnnl_f32, cs) == dnnl_success &&
             dnnl_matmul_desc_init(&md, &a, &b, NULL, &c) == dnnl_success &&
             dnnl_primitive_attr_create(&attr) == dnnl_success &&
             dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && acc)
        ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, 1.0f) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    ok = ok && dnnl_primitive_desc_create(&pd, &md, attr, cx->eng, NULL) == dnnl_success;
    const char *impl = NULL; /* "ref:any": oneDNN's reference loops, far slower than OpenBLAS */
    ok = ok && dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success && impl &&
         strncmp(impl, "ref", 3) != 0 && dnnl_primitive_create(&prim, pd) == dnnl_success;
    omp_set_num_threads(threads);
    const dnnl_memory_desc_t *sp = ok ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
    cx->mm[cx->n_mm] = (mm16){f32, m, n, k, a_trans, b_trans, lda, ldb, ldc, acc, ok ? prim : NULL,
                              ok && sp ? dnnl_memory_desc_get_size(sp) : 0};
    if (!ok && prim) dnnl_primitive_destroy(prim);
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
    return &cx->mm[cx->n_mm++];
}


/* a stream and scratch_n bytes of scratchpad for each of the threads OpenMP would start now */
static int slots_ready(cpu_ctx *cx, size_t scratch) {
    const int want = omp_get_max_threads();
    if (want > cx->slots) {
        dnnl_stream_t *st = realloc(cx->streams, (size_t)want * sizeof *st);
        if (st) cx->streams = st;
        unsigned char **sc = realloc(cx->scratch, (size_t)want * sizeof *sc);
        if (sc) cx->scratch = sc;
        if (!st || !sc) return 0;
        for (; cx->slots < want; cx->slots++) {
            cx->scratch[cx->slots] = NULL;
            if (dnnl_stream_create(&cx->streams[cx->slots], cx->eng, dnnl_stream_default_flags) != dnnl_success)
                return 0;
            if (cx->scratch_n && posix_memalign((void **)&cx->scratch[cx->slots], ALIGN, cx->scratch_n)) {
                dnnl_stream_destroy(cx->streams[cx->slots]);
                return 0;
            }
        }
    }
    if (scratch > cx->scratch_n) { /* the new ones first: where they cannot be had, a job made before
                                      and not yet run (cpu_matmul_bwd) still has the old ones */
        unsigned char **fresh = malloc((size_t)cx->slots * sizeof *fresh);
        int got = 0;
        while (fresh && got < cx->slots && !posix_memalign((void **)&fresh[got], ALIGN, scratch)) got++;
        if (!fresh || got < cx->slots) {
            for (int i = 0; i < got; i++) free(fresh[i]);
            free(fresh);
            return 0;
        }
        for (int i = 0; i < cx->slots; i++) {
            free(cx->scratch[i]);
            cx->scratch[i] = fresh[i];
        }
        free(fresh);
        cx->scratch_n = scratch;
    }
    return 1;
}

/* one tile's product on the calling thread; 0 if oneDNN failed */
static int mm16_run(const cpu_ctx *cx, const mm16 *p, const void *a, const void *b, float *c) {
    const int slot = omp_get_thread_num();
    const dnnl_memory_desc_t *md[4];
    dnnl_memory_t mem[4] = {NULL, NULL, NULL, NULL};
    const_dnnl_primitive_desc_t pd = NULL;
    if (dnnl_primitive_get_primitive_desc(p->prim, &pd) != dnnl_success) return 0;
    md[0] = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
    md[1] = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    md[2] = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
    md[3] = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    void *ptr[4] = {(void *)a, (void *)b, c, cx->scratch ? cx->scratch[slot] : NULL};
    const int arg[4] = {DNNL_ARG_SRC, DNNL_ARG_WEIGHTS, DNNL_ARG_DST, DNNL_ARG_SCRATCHPAD};
    dnnl_exec_arg_t args[4];
    int ok = 1, n = 0;
    for (int i = 0; i < 4 && ok; i++) {
        if (i == 3 && !p->scratch) break;
        ok = md[i] && dnnl_memory_create(&mem[i], md[i], cx->eng, ptr[i]) == dnnl_success;
        args[n++] = (dnnl_exec_arg_t){arg[i], mem[i]};
    }
    ok = ok && dnnl_primitive_execute(p->prim, cx->streams[slot], n, args) == dnnl_success &&
         dnnl_stream_wait(cx->streams[slot]) == dnnl_success;
    for (int i = 0; i < 4; i++)
        if (mem[i]) dnnl_memory_destroy(mem[i]);
    return ok;
}

/* j: the oneDNN job of C(M,N) (+ C when acc) = op(A)(M,K) op(B)(K,N), inputs fp32 (f32) or
 * bf16 (A, B: set by the caller), A and B rows lda and ldb elements apart: gemm_plan's tiles and
 * the primitives of a full tile and of the last row's and column's (4, some the same); 0 where
 * oneDNN refuses a tile's shape or its scratchpads cannot be allocated. Making room for them
 * (mm_room) may drop every primitive, those of jobs made before and not yet run too: a caller
 * that makes several jobs before running them makes room for all first (cpu_matmul_bwd). */
static int tiles_get(cpu_ctx *cx, job *j, int f32, int M, int N, int K, int at, int bt, int lda, int ldb, int ldc,
                     int acc) {
    *j = (job){.kind = JOB_DNNL, .M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc,
               .el = f32 ? (int)sizeof(float) : (int)sizeof(uint16_t)};
    gemm_plan(M, N, K, at ? 0 : PLAN_LONG_K, &j->rows, &j->nr, &j->cols, &j->nc); /* at: no PLAN_GRAD (gemm_plan) */
    const int lr = M - (j->nr - 1) * j->rows, lc = N - (j->nc - 1) * j->cols;
    mm_room(cx, 4);
    const int m[4] = {j->rows, j->rows, lr, lr}, n[4] = {j->cols, lc, j->cols, lc};
    size_t sc = 0;
    for (int i = 0; i < 4; i++) {
        j->p[i] = mm_get(cx, f32, m[i], n[i], K, at, bt, lda, ldb, ldc, acc);
        if (!j->p[i]->prim) return 0;
        if (j->p[i]->scratch > sc) sc = j->p[i]->scratch;
    }
    return slots_ready(cx, sc);
}
#endif

/* Task t of job j on the calling thread (inside a parallel region: OpenBLAS then runs
 * single-threaded); 0 where oneDNN failed */
static int job_task(const cpu_ctx *cx, const job *j, int t) {
    const int tr = t / j->nc, tc = t % j->nc, r0 = tr * j->rows, c0 = tc * j->cols;
    const int m = imin(j->rows, j->M - r0), n = imin(j->cols, j->N - c0);
    switch (j->kind) {
    case JOB_COLSUM: colsum_chunk(j->C, j->A, j->M, j->lda, c0, n); return 1;
    case JOB_BLAS: {
        const float *a = (const float *)j->A + (j->ta == CblasNoTrans ? (size_t)r0 * j->lda : (size_t)r0);
        const float *b = (const float *)j->B + (j->tb == CblasNoTrans ? (size_t)c0 : (size_t)c0 * j->ldb);
        cblas_sgemm(CblasRowMajor, j->ta, j->tb, m, n, j->K, j->alpha, a, j->lda, b, j->ldb, j->beta,
                    j->C + (size_t)r0 * j->ldc + c0, j->ldc);
        return 1;
    }
    default: {
#ifdef DT_HAVE_DNNL
        const mm16 *p0 = j->p[0];
        const char *a = (const char *)j->A + (size_t)j->el * (p0->a_trans ? (size_t)r0 : (size_t)r0 * p0->lda);
        const char *b = (const char *)j->B + (size_t)j->el * (p0->b_trans ? (size_t)c0 * p0->ldb : (size_t)c0);
        return mm16_run(cx, j->p[(tr == j->nr - 1) * 2 + (tc == j->nc - 1)], a, b, j->C + (size_t)r0 * p0->ldc + c0);
#else
        (void)cx;
        return 0;
#endif
    }
    }
}

/* a job's work a task, for jobs_run's order: rows x cols x K of a tile; bias sums 0 (last) */
static double task_cost(const job *j) { return j->kind == JOB_COLSUM ? 0.0 : (double)j->rows * j->cols * j->K; }

/* Runs jobs[0..n) (n <= JOBS_MAX) in one parallel region, the jobs with the larger tasks (rows
 * x cols x K; bias sums last) first, in order among equals. A product is always run inside a
 * parallel region, even as one tile (OpenBLAS's own threading would change its values); bias
 * sums alone of fewer than PAR_MIN elements stay on the calling thread. */
static void jobs_run(const cpu_ctx *cx, const job *jobs, int n) {
    const job *o[JOBS_MAX];
    int first[JOBS_MAX + 1], par = 0;
    for (int i = 0; i < n; i++) { /* insertion sort, larger tasks first, stable */
        int k = i;
        for (; k > 0 && task_cost(o[k - 1]) < task_cost(&jobs[i]); k--) o[k] = o[k - 1];
        o[k] = &jobs[i];
        par |= jobs[i].kind != JOB_COLSUM || (size_t)jobs[i].M * jobs[i].N >= PAR_MIN;
    }
    first[0] = 0;
    for (int i = 0; i < n; i++) first[i + 1] = first[i] + o[i]->nr * o[i]->nc;
    unsigned bad = 0;
#pragma omp parallel for schedule(dynamic, 1) reduction(| : bad) if (par)
    for (int t = 0; t < first[n]; t++) {
        int k = 0;
        while (t >= first[k + 1]) k++;
        if (!job_task(cx, o[k], t - first[k])) bad |= 1u << k;
    }
    for (int k = 0; k < n; k++)
        if (bad >> k & 1) { /* C is partly written: nothing to fall back to */
            fprintf(stderr, "dtrain: oneDNN failed running a%s product (%d x %d x %d); stopping\n",
                    o[k]->el == (int)sizeof(float) ? "" : " bf16", o[k]->M, o[k]->K, o[k]->N);
            abort();
        }
}

static void sgemm_rows(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, float alpha, const float *A, int lda,
                       const float *B, int ldb, float beta, float *C, int ldc) {
    job j;
    job_blas(&j, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    jobs_run(NULL, &j, 1);
}

#ifdef DT_HAVE_DNNL

/* j: the job of C(M,N) = op(A)(M,K) op(B)(K,N) + beta C (beta 0 or 1) with bf16 inputs; 0
 * where it runs in fp32 instead (runs16, or oneDNN refuses). A16, B16: that operand already in
 * bf16 and dense, as it is laid out (a weight of model.lora.base_dtype bf16; a weight gradient's
 * two copies from cpu_matmul_bwd, the output gradient's in cx->a16 and the input's in cx->c16),
 * used as it is; else A, B (fp32, rows lda, ldb apart) are rounded into dense copies in cx->a16
 * and cx->b16 as they are laid out (a transposed operand stays transposed: oneDNN reads it so).
 * A16 is never cx->b16 where B is rounded, nor B16 cx->a16 where A is rounded (that buffer
 * would be grown or overwritten). */
static int gemm16(cpu_ctx *cx, job *j, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float *A,
                  const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C,
                  int ldc) {
    if (!runs16(cx, ta != CblasNoTrans ? K : M)) return 0; /* a transposed A is a weight gradient's: K rows summed */
    const int at = ta != CblasNoTrans, bt = tb != CblasNoTrans;
    if (!tiles_get(cx, j, 0, M, N, K, at, bt, at ? M : K, bt ? K : N, ldc, beta != 0.0f) ||
        (!A16 && !grow((void **)&cx->a16, &cx->a16_n, (size_t)M * K, sizeof(uint16_t))) ||
        (!B16 && !grow((void **)&cx->b16, &cx->b16_n, (size_t)K * N, sizeof(uint16_t))))
        return 0;
    if (!A16) pack16(cx->a16, A, at ? K : M, at ? M : K, lda);
    if (!B16) pack16(cx->b16, B, bt ? N : K, bt ? K : N, ldb);
    j->A = A16 ? A16 : cx->a16, j->B = B16 ? B16 : cx->b16, j->C = C;
    return 1;
}

/* C(M,N) = op(A) op(B) + beta C (beta 0 or 1), fp32, through oneDNN in gemm_plan's tiles; 0 (C
 * untouched) if oneDNN refuses a tile's shape, and for products of fewer than GEMM_TILE rows
 * (generation's few rows, whose new lengths would each make new primitives; a rule of the shape,
 * as the bf16 products' is, so a product's library never depends on the thread count or history) */
static int gemm32(cpu_ctx *cx, job *j, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float *A,
                  int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    if (M < GEMM_TILE || (beta != 0.0f && beta != 1.0f)) return 0;
    if (!tiles_get(cx, j, 1, M, N, K, ta != CblasNoTrans, tb != CblasNoTrans, lda, ldb, ldc, beta != 0.0f)) return 0;
    j->A = A, j->B = B, j->C = C;
    return 1;
}
#endif

/* j: the job of C(M,N) = op(A) op(B) + beta C in fp32: oneDNN's tiles (gemm32) where it runs
 * them, else OpenBLAS's */
static void fp32_job(cpu_ctx *cx, job *j, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float *A,
                     int lda, const float *B, int ldb, float beta, float *C, int ldc) {
#ifdef DT_HAVE_DNNL
    if (cx->f32dnnl && gemm32(cx, j, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc)) return;
#else
    (void)cx;
#endif
    job_blas(j, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
}

static void fp32_gemm(cpu_ctx *cx, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float *A,
                      int lda, const float *B, int ldb, float beta, float *C, int ldc) {
    job j;
    fp32_job(cx, &j, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    jobs_run(cx, &j, 1);
}

/* j: the job of a weight product, C(M,N) = op(A) op(B) + beta C, in bf16 where
 * training.precision asks for it (A16, B16: as gemm16's; ignored in fp32); 1 where it is bf16 */
static int weight_job(cpu_ctx *cx, job *j, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int M, int N, int K, const float *A,
                      const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C,
                      int ldc) {
#ifdef DT_HAVE_DNNL
    if (gemm16(cx, j, ta, tb, M, N, K, A, A16, lda, B, B16, ldb, beta, C, ldc)) return 1;
#else
    (void)A16, (void)B16;
#endif
    fp32_job(cx, j, ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc);
    return 0;
}

/* ---- encoder ---- */

/* encoder_part_fwd (rows [v0, v0 + V) of the table in wte); encoder_fwd: all of them */
static void cpu_encoder_part_fwd(void *ctx, dt_act *out_, const int *tokens, const int *pos, const float *wte,
                                 const float *wpe, int v0, int V, int B, int T, int C) {
    (void)ctx;
    float *out = (float *)out_;
#pragma omp parallel for schedule(static) if ((size_t)B * T * C >= PAR_MIN)
    for (int bt = 0; bt < B * T; bt++) {
        const int k = tokens[bt] - v0;
        float *o = out + (size_t)bt * C;
        if (k < 0 || k >= V) {
            memset(o, 0, (size_t)C * sizeof(float));
            if (!wpe) continue;
        }
        const float *e = k < 0 || k >= V ? o : wte + (size_t)k * C;
        if (!wpe) {
            memcpy(o, e, (size_t)C * sizeof(float));
            continue;
        }
        const float *p = wpe + (size_t)(pos ? pos[bt] : bt % T) * C;
#pragma omp simd
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

static void cpu_encoder_fwd(void *ctx, dt_act *out, const int *tokens, const int *pos, const float *wte,
                            const float *wpe, int B, int T, int C) {
    cpu_encoder_part_fwd(ctx, out, tokens, pos, wte, wpe, 0, INT_MAX, B, T, C);
}

/* encoder_part_fwd from bf16 tables (model.lora.base_dtype), widened as they are read */
static void cpu_encoder16_fwd(void *ctx, dt_act *out_, const int *tokens, const int *pos, const uint16_t *wte,
                              const uint16_t *wpe, int v0, int V, int B, int T, int C) {
    (void)ctx;
    float *out = (float *)out_;
#pragma omp parallel for schedule(static) if ((size_t)B * T * C >= PAR_MIN)
    for (int bt = 0; bt < B * T; bt++) {
        const int k = tokens[bt] - v0;
        float *o = out + (size_t)bt * C;
        if (k < 0 || k >= V) memset(o, 0, (size_t)C * sizeof(float));
        else dt_bf16_unpack(o, wte + (size_t)k * C, (size_t)C);
        if (wpe) dt_bf16_add(o, wpe + (size_t)(pos ? pos[bt] : bt % T) * C, (size_t)C);
    }
}

/* Deterministic: dwpe rows in parallel (sum over b in order; packed rows: over the rows at
 * that position in (b,t) order); dwte in column chunks, each chunk visiting tokens in (b,t)
 * order, so every element accumulates in the serial order. */
static void cpu_encoder_part_bwd(void *ctx, float *dwte, float *dwpe, const dt_act *dout_, const int *tokens,
                                 const int *pos, int v0, int V, int B, int T, int C) {
    (void)ctx;
    const float *dout = (const float *)dout_;
    const int par = (size_t)B * T * C >= PAR_MIN;
#pragma omp parallel for schedule(static) if (par && dwpe)
    for (int t = 0; t < (dwpe ? T : 0); t++) {
        float *d = dwpe + (size_t)t * C;
        for (int b = 0; b < B; b++)
            for (int u = t; u < (pos ? T : t + 1); u++) { /* packed: position t is at rows t.. */
                if (pos && pos[(size_t)b * T + u] != t) continue;
                const float *g = dout + ((size_t)b * T + u) * C;
#pragma omp simd
                for (int c = 0; c < C; c++) d[c] += g[c];
            }
    }
    const int chunk = 2 * COL_CHUNK, nchunks = (C + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if (par)
    for (int ch = 0; ch < nchunks; ch++) {
        const int c0 = ch * chunk, nc = imin(chunk, C - c0);
        for (int bt = 0; bt < B * T; bt++) {
            const int k = tokens[bt] - v0;
            if (k < 0 || k >= V) continue;
            float *d = dwte + (size_t)k * C + c0;
            const float *g = dout + (size_t)bt * C + c0;
#pragma omp simd
            for (int j = 0; j < nc; j++) d[j] += g[j];
        }
    }
}

static void cpu_encoder_bwd(void *ctx, float *dwte, float *dwpe, const dt_act *dout, const int *tokens, const int *pos,
                            int B, int T, int C) {
    cpu_encoder_part_bwd(ctx, dwte, dwpe, dout, tokens, pos, 0, INT_MAX, B, T, C);
}

/* Sums and maxima over a short row without OpenMP's simd reductions: GCC reduces those through
 * an array of lanes one add at a time, and on rows of 32 or 64 floats (attention's rows at 32
 * tokens, LayerNorm's at 64 channels) that serial reduction took most of a row's time. Here a
 * row is read in chunks of LANES floats, each chunk's lanes added onto lane[0..LANES), the lanes
 * added pairwise (lanes_sum, lanesd_sum in double, lanes_max), then the row's last floats past
 * its whole chunks one at a time: the same order for any thread count. */
enum { LANES = 16 };
static inline float lanes_sum(float *l) {
    for (int w = LANES / 2; w > 0; w /= 2)
#pragma omp simd
        for (int i = 0; i < w; i++) l[i] += l[i + w];
    return l[0];
}
static inline double lanesd_sum(double *l) {
    for (int w = LANES / 2; w > 0; w /= 2)
#pragma omp simd
        for (int i = 0; i < w; i++) l[i] += l[i + w];
    return l[0];
}
static inline float lanes_max(float *l) {
    for (int w = LANES / 2; w > 0; w /= 2)
#pragma omp simd
        for (int i = 0; i < w; i++) l[i] = l[i + w] > l[i] ? l[i + w] : l[i];
    return l[0];
}
/* s = the sum over c in [0, n) of EXPR (an expression of c) in double: LANES lanes over the whole
 * chunks, added pairwise, then the terms past them in order (the double sums above, spelled once) */
#define LANES_SUMD(s, n, c, EXPR)                                                                                 \
    do {                                                                                                          \
        const int n_ = (n), whole_ = n_ / LANES * LANES;                                                          \
        double lane_[LANES];                                                                                      \
        for (int l_ = 0; l_ < LANES; l_++) lane_[l_] = 0.0;                                                       \
        for (int c0_ = 0; c0_ < whole_; c0_ += LANES)                                                             \
            _Pragma("omp simd") for (int l_ = 0; l_ < LANES; l_++) {                                              \
                const int c = c0_ + l_;                                                                           \
                lane_[l_] += (EXPR);                                                                              \
            }                                                                                                     \
        s = lanesd_sum(lane_);                                                                                    \
        for (int c = whole_; c < n_; c++) s += (EXPR);                                                            \
    } while (0)

/* ---- layernorm ---- */

DT_CLONES
static void layernorm_row_fwd(float *o, float *mean, float *rstd, const float *x, const float *w,
                              const float *b, int C) {
    double s, v;
    LANES_SUMD(s, C, c, x[c]);
    const float m = (float)(s / C);
    LANES_SUMD(v, C, c, (double)(x[c] - m) * (x[c] - m));
    const float r = 1.0f / sqrtf((float)(v / C) + LN_EPS);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = (x[c] - m) * r * w[c] + b[c];
    *mean = m;
    *rstd = r;
}

static void cpu_layernorm_fwd(void *ctx, dt_act *out_, float *mean, float *rstd, const dt_act *inp_,
                              const float *w, const float *b, int N, int C) {
    float *out = (float *)out_;
    const float *inp = (const float *)inp_;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= PAR_MIN)
    for (int i = 0; i < N; i++)
        layernorm_row_fwd(out + (size_t)i * C, mean + i, rstd + i, inp + (size_t)i * C, w, b, C);
}

/* dx += (w dy - mean(w dy) - n mean(w dy n)) r, with n = (x - m) r */
DT_CLONES
static void layernorm_row_bwd(float *dx, const float *dy, const float *x, const float *w, float m,
                              float r, int C) {
    const int cL = C / LANES * LANES;
    double la[LANES], lb[LANES];
    for (int l = 0; l < LANES; l++) la[l] = lb[l] = 0.0;
    for (int c0 = 0; c0 < cL; c0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const int c = c0 + l;
            const float dn = w[c] * dy[c];
            la[l] += dn;
            lb[l] += (double)dn * ((x[c] - m) * r);
        }
    double sa = lanesd_sum(la), sb = lanesd_sum(lb);
    for (int c = cL; c < C; c++) {
        const float dn = w[c] * dy[c];
        sa += dn;
        sb += (double)dn * ((x[c] - m) * r);
    }
    const float dm = (float)(sa / C), dnm = (float)(sb / C);
#pragma omp simd
    for (int c = 0; c < C; c++) {
        const float n = (x[c] - m) * r;
        dx[c] += (w[c] * dy[c] - dm - n * dnm) * r;
    }
}

/* A norm's weight (and LayerNorm's bias) gradient over columns [c0, c0 + nc) of the N rows: dw +=
 * the sum over rows of dy (x - mean) rstd (RMSNorm: mean NULL, dy x rstd), db += that of dy (db
 * NULL: none); each column's rows added in order in double, the same bits on any thread */
DT_CLONES
static void norm_dw_chunk(float *dw, float *db, const float *dout, const float *inp, const float *mean,
                          const float *rstd, int N, int C, int c0, int nc) {
    double aw[COLSUM_WIDE] = {0}, ab[COLSUM_WIDE] = {0};
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C + c0, *dy = dout + (size_t)i * C + c0;
        const float m = mean ? mean[i] : 0.0f, r = rstd[i];
        if (db) {
#pragma omp simd
            for (int j = 0; j < nc; j++) {
                aw[j] += (double)dy[j] * ((x[j] - m) * r);
                ab[j] += dy[j];
            }
        } else {
#pragma omp simd
            for (int j = 0; j < nc; j++) aw[j] += (double)dy[j] * ((x[j] - m) * r);
        }
    }
    for (int j = 0; j < nc; j++) dw[c0 + j] += (float)aw[j];
    if (db)
        for (int j = 0; j < nc; j++) db[c0 + j] += (float)ab[j];
}

static void cpu_layernorm_bwd(void *ctx, dt_act *dinp_, float *dw, float *db, const dt_act *dout_,
                              const dt_act *inp_, const float *w, const float *mean,
                              const float *rstd, int N, int C) {
    float *dinp = (float *)dinp_;
    const float *dout = (const float *)dout_;
    const float *inp = (const float *)inp_;
    const int par = (size_t)N * C >= PAR_MIN;
#pragma omp parallel for schedule(static) if (par)
    for (int i = 0; i < N; i++)
        layernorm_row_bwd(dinp + (size_t)i * C, dout + (size_t)i * C, inp + (size_t)i * C, w,
                          mean[i], rstd[i], C);
    if (!dw) return; /* frozen */
    const int cw = col_width(C), nchunks = (C + cw - 1) / cw;
#pragma omp parallel for schedule(static) if (par)
    for (int ch = 0; ch < nchunks; ch++) {
        const int c0 = ch * cw, nc = imin(cw, C - c0);
        norm_dw_chunk(dw, db, dout, inp, mean, rstd, N, C, c0, nc);
    }
}

/* ---- rmsnorm ---- */

DT_CLONES
static void rmsnorm_row_fwd(float *o, float *rstd, const float *x, const float *w, int C, float eps) {
    double v;
    LANES_SUMD(v, C, c, (double)x[c] * x[c]);
    const float r = 1.0f / sqrtf((float)(v / C) + eps);
#pragma omp simd
    for (int c = 0; c < C; c++) o[c] = w[c] * (x[c] * r);
    *rstd = r;
}

static void cpu_rmsnorm_fwd(void *ctx, dt_act *out_, float *rstd, const dt_act *inp_, const float *w, int N, int C,
                            float eps) {
    float *out = (float *)out_;
    const float *inp = (const float *)inp_;
#pragma omp parallel for schedule(static) if ((size_t)N * C >= PAR_MIN)
    for (int i = 0; i < N; i++) rmsnorm_row_fwd(out + (size_t)i * C, rstd + i, inp + (size_t)i * C, w, C, eps);
}

/* y = w x r, r = (mean(x^2) + eps)^-1/2: dx += r w dy - x r^3 mean(w dy x) */
DT_CLONES
static void rmsnorm_row_bwd(float *dx, const float *dy, const float *x, const float *w, float r, int C) {
    double s;
    LANES_SUMD(s, C, c, (double)(w[c] * dy[c]) * x[c]);
    const float k = (float)(s / C) * r * r * r;
#pragma omp simd
    for (int c = 0; c < C; c++) dx[c] += r * (w[c] * dy[c]) - k * x[c];
}

static void cpu_rmsnorm_bwd(void *ctx, dt_act *dinp_, float *dw, const dt_act *dout_, const dt_act *inp_,
                            const float *w, const float *rstd, int N, int C) {
    float *dinp = (float *)dinp_;
    const float *dout = (const float *)dout_, *inp = (const float *)inp_;
    const int par = (size_t)N * C >= PAR_MIN;
#pragma omp parallel for schedule(static) if (par)
    for (int i = 0; i < N; i++)
        rmsnorm_row_bwd(dinp + (size_t)i * C, dout + (size_t)i * C, inp + (size_t)i * C, w, rstd[i], C);
    if (!dw) return; /* frozen */
    const int cw = col_width(C), nchunks = (C + cw - 1) / cw;
#pragma omp parallel for schedule(static) if (par)
    for (int ch = 0; ch < nchunks; ch++) { /* dw in column chunks, rows in order: the same bits for any thread count */
        const int c0 = ch * cw, nc = imin(cw, C - c0);
        norm_dw_chunk(dw, NULL, dout, inp, NULL, rstd, N, C, c0, nc);
    }
}

/* ---- matmul ---- */

/* out's M rows (ldo apart) = bias (N), when there is one: the beta a product then adds onto them with */
static float bias_rows(float *out, const float *bias, int M, int N, int ldo) {
    if (!bias) return 0.0f;
#pragma omp parallel for schedule(static) if ((size_t)M * N >= PAR_MIN)
    for (int i = 0; i < M; i++) memcpy(out + (size_t)i * ldo, bias, (size_t)N * sizeof(float));
    return 1.0f;
}

static void cpu_matmul_fwd(void *ctx, dt_act *out_, const dt_act *inp_, const float *w,
                           const float *bias, int M, int K, int N, int ldo, int w_trans) {
    float *out = (float *)out_;
    const float *inp = (const float *)inp_;
    const float beta = bias_rows(out, bias, M, N, ldo);
    job j;
    weight_job(ctx, &j, CblasNoTrans, w_trans ? CblasTrans : CblasNoTrans, M, N, K, inp, NULL, K, w, NULL,
               w_trans ? K : N, beta, out, ldo);
    jobs_run(ctx, &j, 1);
}

/* In bf16 the input gradient's product leaves dout rounded, dense (M,N), in cx->a16 (d16: it
 * ran in bf16); the weight gradient reads that copy instead of rounding dout again, and its other
 * input (inp) is rounded into cx->c16, so that neither product's copies are overwritten before
 * both have run, in one parallel region. A weight gradient's bf16 rule is its sum's length, the
 * M rows of the batch (runs16): its own rows are a weight's, few in a small model (64 in the
 * shipped fine-tune's). d16 is 0 in fp32 and in a build without oneDNN. */
static void cpu_matmul_bwd(void *ctx, dt_act *dinp_, float *dw, float *dbias, const dt_act *dout_,
                           const dt_act *inp_, const float *w, int M, int K, int N, int ldo, int w_trans) {
    cpu_ctx *cx = ctx;
    float *dinp = (float *)dinp_;
    const float *dout = (const float *)dout_;
    const float *inp = (const float *)inp_;
    job jobs[3];
    int n = 0, d16 = 0; /* d16: cx->a16 holds dout in bf16 */
    const uint16_t *x16 = NULL; /* inp in bf16, dense (M,K), in cx->c16 */
#ifdef DT_HAVE_DNNL
    mm_room(cx, 16); /* two products' primitives, made before either runs: at most 4 a try, 2 tries each */
#endif
    if (dinp) /* dinp(M,K) = dout(M,N) @ W^T */
        d16 = weight_job(cx, &jobs[n++], CblasNoTrans, w_trans ? CblasNoTrans : CblasTrans, M, K, N, dout, NULL, ldo,
                         w, NULL, w_trans ? K : N, 0.0f, dinp, K);
#ifdef DT_HAVE_DNNL
    if (dw && d16 && grow((void **)&cx->c16, &cx->c16_n, (size_t)M * K, sizeof(uint16_t)))
        pack16(cx->c16, inp, M, K, K), x16 = cx->c16;
    else if (dw && d16) /* no room for that copy: the weight gradient rounds both its inputs into */
        jobs_run(cx, jobs, n), n = 0, d16 = 0; /* a16 and b16, after the input gradient has run */
#endif
    if (dw && w_trans) /* dW(N,K) += dout^T @ inp */
        weight_job(cx, &jobs[n++], CblasTrans, CblasNoTrans, N, K, M, dout, d16 ? cx->a16 : NULL, ldo, inp, x16, K,
                   1.0f, dw, K);
    else if (dw) /* dW(K,N) += inp^T @ dout */
        weight_job(cx, &jobs[n++], CblasTrans, CblasNoTrans, K, N, M, inp, x16, K, dout, d16 ? cx->a16 : NULL, ldo,
                   1.0f, dw, N);
    if (dbias) job_colsum(&jobs[n++], dbias, dout, M, N, ldo);
    jobs_run(cx, jobs, n);
}

/* ---- products of a bf16 weight (model.lora.base_dtype): widened a piece at a time ----
 * A piece is the weight's part for output columns [n0, n0 + nb), nb a multiple of 16 sized by
 * K and N alone (so the same pieces for any thread count): W (N,K)'s rows n0.. (contiguous), or
 * W (K,N)'s columns n0.. gathered into (K, nb). */

/* the columns of a piece: as many as cx->panel holds */
static int panel_cols(const cpu_ctx *cx, int K, int N) {
    int nb = (int)(cx->panel_n / (size_t)K);
    if (nb < N) nb = nb / 16 * 16;
    return nb < 1 ? 1 : nb < N ? nb : N;
}

/* the piece of w for output columns [n0, n0 + nb) into cx->panel: (nb, K) with w_trans, else (K, nb) */
static const float *panel_fill(cpu_ctx *cx, const uint16_t *w, int K, int N, int n0, int nb, int w_trans) {
    float *p = cx->panel;
    if (w_trans) {
#pragma omp parallel for schedule(static) if ((size_t)nb * K >= PAR_MIN)
        for (int j = 0; j < nb; j++) dt_bf16_unpack(p + (size_t)j * K, w + (size_t)(n0 + j) * K, (size_t)K);
    } else {
#pragma omp parallel for schedule(static) if ((size_t)nb * K >= PAR_MIN)
        for (int k = 0; k < K; k++) dt_bf16_unpack(p + (size_t)k * nb, w + (size_t)k * N + n0, (size_t)nb);
    }
    return p;
}

static void cpu_matmul16_fwd(void *ctx, dt_act *out_, const dt_act *inp_, const uint16_t *w, const float *bias, int M,
                             int K, int N, int ldo, int w_trans) {
    cpu_ctx *cx = ctx;
    float *out = (float *)out_;
    const float *inp = (const float *)inp_;
    const float beta = bias_rows(out, bias, M, N, ldo);
#ifdef DT_HAVE_DNNL /* bf16 products: the weight as it is */
    job j;
    if (gemm16(cx, &j, CblasNoTrans, w_trans ? CblasTrans : CblasNoTrans, M, N, K, inp, NULL, K, NULL, w, 0, beta,
               out, ldo)) {
        jobs_run(cx, &j, 1);
        return;
    }
#endif
    const int nb = panel_cols(cx, K, N);
    for (int n0 = 0; n0 < N; n0 += nb) { /* out[:, n0..] = inp @ the piece */
        const int n = imin(nb, N - n0);
        const float *p = panel_fill(cx, w, K, N, n0, n, w_trans);
        fp32_gemm(cx, CblasNoTrans, w_trans ? CblasTrans : CblasNoTrans, M, n, K, inp, K, p, w_trans ? K : n, beta,
                  out + n0, ldo);
    }
}

static void cpu_matmul16_bwd(void *ctx, dt_act *dinp_, const dt_act *dout_, const uint16_t *w, int M, int K, int N,
                             int ldo, int w_trans) {
    cpu_ctx *cx = ctx;
    const float *dout = (const float *)dout_;
#ifdef DT_HAVE_DNNL /* bf16 products: the weight as it is */
    job j;
    if (gemm16(cx, &j, CblasNoTrans, w_trans ? CblasNoTrans : CblasTrans, M, K, N, dout, NULL, ldo, NULL, w, 0,
               0.0f, (float *)dinp_, K)) {
        jobs_run(cx, &j, 1);
        return;
    }
#endif
    const int nb = panel_cols(cx, K, N);
    for (int n0 = 0; n0 < N; n0 += nb) { /* dinp(M,K) (+)= dout[:, n0..] @ the piece^T, the pieces in order */
        const int n = imin(nb, N - n0);
        const float *p = panel_fill(cx, w, K, N, n0, n, w_trans);
        fp32_gemm(cx, CblasNoTrans, w_trans ? CblasNoTrans : CblasTrans, M, K, n, dout + n0, ldo, p, w_trans ? K : n,
                  n0 ? 1.0f : 0.0f, (float *)dinp_, K);
    }
}

/* ---- LoRA adapters: thin products, each through sgemm_rows (thread-invariant) ---- */

static void cpu_lora_fwd(void *ctx, dt_act *out_, float *h, const dt_act *inp_, const float *A, const float *B, int M,
                         int K, int N, int r, int ldo, float s) {
    (void)ctx;
    const float *inp = (const float *)inp_;
    sgemm_rows(CblasNoTrans, CblasTrans, M, r, K, 1.0f, inp, K, A, K, 0.0f, h, r);               /* h = inp A^T */
    sgemm_rows(CblasNoTrans, CblasTrans, M, N, r, s, h, r, B, r, 1.0f, (float *)out_, ldo);       /* out += s h B^T */
}

static void cpu_lora_bwd(void *ctx, dt_act *dinp_, float *dA, float *dB, const float *h, float *dh,
                         const dt_act *dout_, const dt_act *inp_, const float *A, const float *B, int M, int K, int N,
                         int r, int ldo, float s) {
    (void)ctx;
    const float *inp = (const float *)inp_, *dout = (const float *)dout_;
    job j[2];
    int n = 0; /* two products at a time, each pair in one parallel region (jobs_run) */
    if (dout) job_blas(&j[n++], CblasNoTrans, CblasNoTrans, M, r, N, s, dout, ldo, B, r, 0.0f, dh, r); /* dh = s dout B */
    if (dout && dB) job_blas(&j[n++], CblasTrans, CblasNoTrans, N, r, M, s, dout, ldo, h, r, 1.0f, dB, r); /* dB += s dout^T h */
    jobs_run(NULL, j, n);
    n = 0; /* then what reads dh */
    if (dA) job_blas(&j[n++], CblasTrans, CblasNoTrans, r, K, M, 1.0f, dh, r, inp, K, 1.0f, dA, K); /* dA += dh^T inp */
    if (dinp_) job_blas(&j[n++], CblasNoTrans, CblasNoTrans, M, K, r, 1.0f, dh, r, A, K, 1.0f, (float *)dinp_, K); /* += dh A */
    jobs_run(NULL, j, n);
}

/* ---- attention ----
 * Per (b,h): q is a (T,hs) view into qkv with row stride W = (NH+2NKV)*hs; k and v those of
 * key/value head g = h / (NH/NKV); P = att[b,h] (T,T). Queries are processed in blocks of
 * ATT_BLK rows; block [r0,r1) only needs keys [0,r1), so the blocks above the diagonal are never
 * computed. Entries above the diagonal of P (and of dS in datt) are written as exact zeros. */

/* The last pass of a causal softmax row, forward (bwd 0: x[j] *= inv) or backward (bwd 1: x[j] =
 * p[j] * (x[j] - dot)) on [lo, t], and 0 on the rest of the row's T columns: whole chunks of LANES
 * columns, each column's value selected (a row of 32 keys is two chunks, where loops over [lo, t]
 * and the zeros on either side left most of it to scalar remainders), then the columns past the
 * last whole chunk one at a time. */
static inline void softmax_row_end(float *x, int bwd, float inv, float dot, const float *p, int lo, int t, int T) {
    const int cT = T / LANES * LANES;
    for (int j0 = 0; j0 < cT; j0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const int j = j0 + l;
            const float y = bwd ? p[j] * (x[j] - dot) : x[j] * inv;
            x[j] = j >= lo && j <= t ? y : 0.0f;
        }
    for (int j = cT; j < T; j++) x[j] = j >= lo && j <= t ? (bwd ? p[j] * (x[j] - dot) : x[j] * inv) : 0.0f;
}

/* p[lo..t] = softmax(p[lo..t]); p[0..lo) and p[t+1..T) = 0 (lo > 0: the row's example starts
 * at row lo of a packed sequence). Whole chunks of LANES columns from lo's chunk on, the columns
 * outside [lo, t] masked out (they may hold anything: read, never used), then the columns of a
 * last part chunk one at a time (only where T is not a multiple of LANES). */
DT_CLONES
static void softmax_causal_row(float *p, int lo, int t, int T) {
    const int c0 = lo / LANES * LANES, cT = T / LANES * LANES, c1 = imin(cT, (t + LANES) / LANES * LANES);
    float lane[LANES], mx = p[lo], sum;
    for (int l = 0; l < LANES; l++) lane[l] = mx;
    for (int j0 = c0; j0 < c1; j0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const int j = j0 + l;
            const float pj = p[j], x = j >= lo && j <= t ? pj : mx; /* loads and arithmetic unmasked, */
            lane[l] = x > lane[l] ? x : lane[l];                        /* so AVX2 and SSE vectorize too */
        }
    mx = lanes_max(lane);
    for (int j = imax(c1, lo); j <= t; j++) mx = p[j] > mx ? p[j] : mx;
    for (int l = 0; l < LANES; l++) lane[l] = 0.0f;
    for (int j0 = c0; j0 < c1; j0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const int j = j0 + l;
            const float x = fast_expf(p[j] - mx), y = j >= lo && j <= t ? x : 0.0f;
            p[j] = y;
            lane[l] += y;
        }
    sum = lanes_sum(lane);
    for (int j = imax(c1, lo); j <= t; j++) sum += p[j] = fast_expf(p[j] - mx);
    softmax_row_end(p, 0, 1.0f / sum, 0.0f, NULL, lo, t, T);
}

/* d (= dP on entry) becomes dS = p * (dP - sum_j p dP) on [lo..t], 0 elsewhere; in chunks as
 * softmax_causal_row */
DT_CLONES
static void softmax_causal_row_bwd(float *d, const float *p, int lo, int t, int T) {
    const int c0 = lo / LANES * LANES, cT = T / LANES * LANES, c1 = imin(cT, (t + LANES) / LANES * LANES);
    float lane[LANES];
    for (int l = 0; l < LANES; l++) lane[l] = 0.0f;
    for (int j0 = c0; j0 < c1; j0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) {
            const int j = j0 + l;
            const float pd = p[j] * d[j];
            lane[l] += j >= lo && j <= t ? pd : 0.0f;
        }
    float dot = lanes_sum(lane);
    for (int j = imax(c1, lo); j <= t; j++) dot += p[j] * d[j];
    softmax_row_end(d, 1, 0.0f, dot, p, lo, t, T);
}

/* the first row that row t of sequence b attends to: 0, or its example's first with packed rows
 * (never decreasing with t: a block of rows needs keys from its first row's on) */
static inline int att_lo(const dt_att_shape *s, int b, int t) { return s->pos ? t - s->pos[(size_t)b * s->T + t] : 0; }
/* the end of the rows that attend to row c - 1 of sequence b: T, or with packed rows the end of
 * its example */
static inline int att_hi(const dt_att_shape *s, int b, int c) {
    if (!s->pos) return s->T;
    while (c < s->T && s->pos[(size_t)b * s->T + c] != 0) c++;
    return c;
}

/* the widths of an attention's rows: W of qkv, HQ of out, and where k and v start in a qkv row */
typedef struct att_dims {
    int W, HQ, koff, voff, group;
} att_dims;
static att_dims att_dims_of(const dt_att_shape *s) {
    return (att_dims){(s->NH + 2 * s->NKV) * s->hs, s->NH * s->hs, s->NH * s->hs, (s->NH + s->NKV) * s->hs,
                      s->NH / s->NKV};
}

/* the probabilities and their gradient, (B,NH,T,T) floats each */
static int cpu_attention_bytes(void *ctx, const dt_att_shape *s, int bf16, size_t *att, size_t *datt) {
    (void)ctx, (void)bf16;
    *att = *datt = (size_t)s->B * (size_t)s->NH * (size_t)s->T * (size_t)s->T * sizeof(float);
    return 1;
}

#ifdef DT_HAVE_DNNL
/* ---- attention in bf16 (training.precision bf16) ----
 * Where att16_runs (sequences of 64 rows or more, heads of 64 or more, or of 32 with 256 rows or
 * more: smaller ones' products are too small for oneDNN's calls to pay; at T=128 heads of 32 were
 * no faster, at T=32 heads of 16 2-4x slower a product), the attention's products take bf16
 * inputs with fp32 accumulation, as the weight products do. q, k and v are rounded once a call
 * into cx->a16 at qkv's row width W (the forward's q times the scale first), the backward's dout
 * into cx->b16 at the same width; a block's probabilities, and dS times the scale, are rounded
 * into the thread's part of cx->c16 (ATT_BLK x T elements a thread). The softmax and its
 * backward stay fp32, on P and dS. Keys (and, for dK and dV, queries) go in chunks of at most
 * ATT_KCH from a multiple of ATT_BLK, so that a call makes few shapes of products: packed rows'
 * blocks then read a few rows of the example before, whose probabilities are exact zeros. Every
 * product of a head runs on that head's thread through a primitive made for one thread: the
 * same bits for any thread count. A call's shapes: at most 9 of q k^T (and dO v^T, the same
 * primitive), 18 each of P v and dS k (first chunk or accumulating), 32 of P^T dO and dS^T q. */
#define ATT_KCH 256

static inline int att16_runs(const cpu_ctx *cx, const dt_att_shape *s) {
    return cx->bf16 && s->T >= ATT_BLK && (s->hs >= 64 || (s->hs >= 32 && s->T >= 256));
}

/* one call's products: made (make: the primitives, first, on the calling thread) or run */
typedef struct att16 {
    cpu_ctx *cx;
    int make, full, bad; /* full: the table had no room (make); bad: a primitive refused or failed */
    size_t scratch;      /* the largest scratchpad of the primitives made */
} att16;

/* C(m,n) (+ C when acc) = op(A) op(B), A and B bf16, at those offsets from a, b and c (NULL in make) */
static void att16_mm(att16 *w, int m, int n, int k, int at, int bt, int lda, int ldb, int ldc, int acc,
                     const uint16_t *a, size_t ao, const uint16_t *b, size_t bo, float *c, size_t co) {
    const mm16 *p = mm_find(w->cx, 0, m, n, k, at, bt, lda, ldb, ldc, acc);
    if (w->make) {
        if (!p && w->cx->n_mm == MM16_MAX) {
            w->full = 1;
            return;
        }
        if (!p) p = mm_get(w->cx, 0, m, n, k, at, bt, lda, ldb, ldc, acc);
        if (!p->prim) w->bad = 1;
        else if (p->scratch > w->scratch) w->scratch = p->scratch;
        return;
    }
    if (!p || !p->prim || !mm16_run(w->cx, p, a + ao, b + bo, c + co)) w->bad = 1;
}

/* dst (rows, cols), rows ldd apart = bf16 of src (rows, cols), rows lds apart, times s */
DT_CLONES
static void att16_round(uint16_t *dst, int ldd, const float *src, int lds, int rows, int cols, float s) {
    for (int i = 0; i < rows; i++) {
        uint16_t *d = dst + (size_t)i * ldd;
        const float *x = src + (size_t)i * lds;
        if (s == 1.0f) {
            dt_bf16_pack(d, x, (size_t)cols);
            continue;
        }
#pragma omp simd
        for (int j = 0; j < cols; j++) d[j] = dt_float_to_bf16(x[j] * s);
    }
}

/* the first key of query block [r0, ..) of sequence b, aligned down to ATT_BLK */
static inline int att16_k0(const dt_att_shape *s, int b, int r0) { return att_lo(s, b, r0) / ATT_BLK * ATT_BLK; }

/* Forward of query head h of sequence b (make: its products' shapes only, every pointer NULL):
 * P = scale q k^T by blocks of ATT_BLK queries, softmax, out = P v. x16: qkv in bf16 (q scaled),
 * buf: the thread's ATT_BLK x T bf16, out: the sequence's first row, P: the head's (T,T). */
static void att16_head_fwd(att16 *w, float *out, float *P, const uint16_t *x16, uint16_t *buf, const dt_att_shape *s,
                           const att_dims *d, int b, int h) {
    const int T = s->T, hs = s->hs, g = h / d->group, W = d->W;
    const size_t row = (size_t)b * T * W, q = row + (size_t)h * hs, k = row + d->koff + (size_t)g * hs,
                 v = row + d->voff + (size_t)g * hs, o = (size_t)h * hs;
    for (int r0 = 0; r0 < T; r0 += ATT_BLK) {
        const int r1 = imin(T, r0 + ATT_BLK), m = r1 - r0, ka = att16_k0(s, b, r0);
        for (int c = ka; c < r1; c += ATT_KCH)
            att16_mm(w, m, imin(ATT_KCH, r1 - c), hs, 0, 1, W, W, T, 0, x16, q + (size_t)r0 * W, x16,
                     k + (size_t)c * W, P, (size_t)r0 * T + c);
        if (!w->make) {
            for (int t = r0; t < r1; t++) softmax_causal_row(P + (size_t)t * T, att_lo(s, b, t), t, T);
            att16_round(buf + ka, T, P + (size_t)r0 * T + ka, T, m, r1 - ka, 1.0f);
        }
        for (int c = ka; c < r1; c += ATT_KCH)
            att16_mm(w, m, hs, imin(ATT_KCH, r1 - c), 0, 0, T, W, d->HQ, c > ka, buf, (size_t)c, x16,
                     v + (size_t)c * W, out, o + (size_t)r0 * d->HQ);
    }
}

/* Backward of query head h of sequence b (make: as att16_head_fwd) into dqkv, laid out as qkv:
 * dq, and dk, dv of its key/value head (added onto when acc). x16: qkv in bf16 (unscaled), do16:
 * dout in bf16 at qkv's width, dS: the head's (T,T) scratch, buf: the thread's ATT_BLK x T bf16. */
static void att16_head_bwd(att16 *w, float *dqkv, float *dS, const float *P, const uint16_t *x16, const uint16_t *do16,
                           uint16_t *buf, const dt_att_shape *s, const att_dims *d, int b, int h, float scale,
                           int acc) {
    const int T = s->T, hs = s->hs, g = h / d->group, W = d->W;
    const size_t row = (size_t)b * T * W, q = row + (size_t)h * hs, k = row + d->koff + (size_t)g * hs,
                 v = row + d->voff + (size_t)g * hs;
    for (int r0 = 0; r0 < T; r0 += ATT_BLK) { /* dP = dO v^T, dS, dq = scale dS k */
        const int r1 = imin(T, r0 + ATT_BLK), m = r1 - r0, ka = att16_k0(s, b, r0);
        for (int c = ka; c < r1; c += ATT_KCH)
            att16_mm(w, m, imin(ATT_KCH, r1 - c), hs, 0, 1, W, W, T, 0, do16, q + (size_t)r0 * W, x16,
                     v + (size_t)c * W, dS, (size_t)r0 * T + c);
        if (!w->make) {
            for (int t = r0; t < r1; t++)
                softmax_causal_row_bwd(dS + (size_t)t * T, P + (size_t)t * T, att_lo(s, b, t), t, T);
            att16_round(buf + ka, T, dS + (size_t)r0 * T + ka, T, m, r1 - ka, scale);
        }
        for (int c = ka; c < r1; c += ATT_KCH)
            att16_mm(w, m, hs, imin(ATT_KCH, r1 - c), 0, 0, T, W, W, c > ka, buf, (size_t)c, x16, k + (size_t)c * W,
                     dqkv, q + (size_t)r0 * W);
    }
    for (int c0 = 0; c0 < T; c0 += ATT_BLK) { /* keys [c0, c1): dv = P^T dO, dk = scale dS^T q */
        const int c1 = imin(T, c0 + ATT_BLK), n = c1 - c0;
        /* the queries that attend to them, to a multiple of ATT_BLK (those past hold zeros there) */
        const int rows = imin(T - c0, (att_hi(s, b, c1) - c0 + ATT_BLK - 1) / ATT_BLK * ATT_BLK);
        for (int pass = 0; pass < 2; pass++) {
            if (!w->make)
                att16_round(buf, ATT_BLK, (pass ? dS : P) + (size_t)c0 * T + c0, T, rows, n, pass ? scale : 1.0f);
            for (int r = 0; r < rows; r += ATT_KCH)
                att16_mm(w, n, hs, imin(ATT_KCH, rows - r), 1, 0, ATT_BLK, W, W, acc || r > 0, buf,
                         (size_t)r * ATT_BLK, pass ? x16 : do16, q + (size_t)(c0 + r) * W, dqkv,
                         (pass ? k : v) + (size_t)c0 * W);
        }
    }
}

/* The primitives of a call's products made, its copies' room had, its inputs rounded (q times
 * qs) into cx->a16 (and dout into cx->b16 when dout); 0 where oneDNN refuses a shape or memory is
 * short: the call then runs in fp32. bwd: make the backward's products. */
static int att16_prepare(cpu_ctx *cx, att16 *w, const float *qkv, const float *dout, float qs, const dt_att_shape *s,
                         const att_dims *d, int bwd) {
    const int T = s->T, threads = omp_get_max_threads();
    const size_t nx = (size_t)s->B * T * d->W;
    *w = (att16){.cx = cx, .make = 1};
    for (int tries = 0; tries < 2; tries++) { /* a full table is emptied once (mm_room) */
        w->full = w->bad = 0;
        for (int b = 0; b < (s->pos ? s->B : 1); b++) /* without packed rows every sequence is the same */
            for (int acc = 0; acc < (bwd && d->group > 1 ? 2 : 1); acc++) {
                if (bwd) att16_head_bwd(w, NULL, NULL, NULL, NULL, NULL, NULL, s, d, b, 0, 1.0f, acc);
                else att16_head_fwd(w, NULL, NULL, NULL, NULL, s, d, b, 0);
            }
        if (!w->full) break;
        mm_room(cx, MM16_MAX + 1);
    }
    if (w->full || w->bad || !slots_ready(cx, w->scratch) || !grow((void **)&cx->a16, &cx->a16_n, nx, 2) ||
        (dout && !grow((void **)&cx->b16, &cx->b16_n, nx, 2)) ||
        !grow((void **)&cx->c16, &cx->c16_n, (size_t)threads * ATT_BLK * T, 2))
        return 0;
    const int rows = s->B * T;
#pragma omp parallel for schedule(static) if (nx >= PAR_MIN)
    for (int i = 0; i < rows; i++) {
        uint16_t *x = cx->a16 + (size_t)i * d->W;
        const float *r = qkv + (size_t)i * d->W;
        att16_round(x, d->W, r, d->W, 1, d->HQ, qs);
        dt_bf16_pack(x + d->HQ, r + d->HQ, (size_t)(d->W - d->HQ));
        if (dout) dt_bf16_pack(cx->b16 + (size_t)i * d->W, dout + (size_t)i * d->HQ, (size_t)d->HQ);
    }
    w->make = 0;
    return 1;
}

/* 1 once a call's products have run; where one failed, its output is partly written: nothing
 * to fall back to (as jobs_run) */
static int att16_ran(int bad) {
    if (bad) {
        fprintf(stderr, "dtrain: oneDNN failed running a bf16 attention product; stopping\n");
        abort();
    }
    return 1;
}

static int att16_fwd(cpu_ctx *cx, float *out, float *att, const float *qkv, const dt_att_shape *s) {
    const att_dims d = att_dims_of(s);
    att16 w;
    if (!att16_runs(cx, s) || !att16_prepare(cx, &w, qkv, NULL, 1.0f / sqrtf((float)s->hs), s, &d, 0)) return 0;
    const int T = s->T, NH = s->NH;
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int bh = 0; bh < s->B * NH; bh++) {
        att16 t = w;
        const int b = bh / NH, h = bh % NH;
        att16_head_fwd(&t, out + (size_t)b * T * d.HQ, att + (size_t)bh * T * T, cx->a16,
                       cx->c16 + (size_t)omp_get_thread_num() * ATT_BLK * T, s, &d, b, h);
        bad |= t.bad;
    }
    return att16_ran(bad);
}

static int att16_bwd(cpu_ctx *cx, float *dqkv, float *datt, const float *dout, const float *qkv, const float *att,
                     const dt_att_shape *s) {
    const att_dims d = att_dims_of(s);
    att16 w;
    if (!att16_runs(cx, s) || !att16_prepare(cx, &w, qkv, dout, 1.0f, s, &d, 1)) return 0;
    const int T = s->T, NH = s->NH, hs = s->hs;
    const float scale = 1.0f / sqrtf((float)hs);
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad)
    for (int bg = 0; bg < s->B * s->NKV; bg++) {
        att16 t = w;
        const int b = bg / s->NKV, g = bg % s->NKV;
        uint16_t *buf = cx->c16 + (size_t)omp_get_thread_num() * ATT_BLK * T;
        for (int j = 0; j < d.group; j++) {
            const int h = g * d.group + j, bh = b * NH + h;
            att16_head_bwd(&t, dqkv, datt + (size_t)bh * T * T, att + (size_t)bh * T * T, cx->a16, cx->b16, buf, s,
                           &d, b, h, scale, j > 0);
        }
        bad |= t.bad;
    }
    return att16_ran(bad);
}
#endif

static void cpu_attention_fwd(void *ctx, dt_act *out_, void *att_, const dt_act *qkv_, const dt_att_shape *s) {
    float *out = (float *)out_;
    float *att = (float *)att_;
    const float *qkv = (const float *)qkv_;
#ifdef DT_HAVE_DNNL
    if (att16_fwd(ctx, out, att, qkv, s)) return;
#else
    (void)ctx;
#endif
    const int T = s->T, NH = s->NH, hs = s->hs;
    const att_dims d = att_dims_of(s);
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for schedule(static) /* even one (b, h): OpenBLAS then runs single-threaded, as always here */
    for (int bh = 0; bh < s->B * NH; bh++) {
        const int b = bh / NH, h = bh % NH, g = h / d.group;
        const float *row = qkv + (size_t)b * T * d.W;
        const float *q = row + (size_t)h * hs, *k = row + d.koff + (size_t)g * hs, *v = row + d.voff + (size_t)g * hs;
        float *P = att + (size_t)bh * T * T;
        float *o = out + (size_t)b * T * d.HQ + (size_t)h * hs;
        for (int r0 = 0; r0 < T; r0 += ATT_BLK) {
            /* keys [k0, r1): packed rows skip the examples before the block's first row's */
            const int r1 = imin(T, r0 + ATT_BLK), m = r1 - r0, k0 = att_lo(s, b, r0);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1 - k0, hs, scale, q + (size_t)r0 * d.W, d.W,
                        k + (size_t)k0 * d.W, d.W, 0.0f, P + (size_t)r0 * T + k0, T);
            for (int t = r0; t < r1; t++) softmax_causal_row(P + (size_t)t * T, att_lo(s, b, t), t, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, r1 - k0, 1.0f, P + (size_t)r0 * T + k0, T,
                        v + (size_t)k0 * d.W, d.W, 0.0f, o + (size_t)r0 * d.HQ, d.HQ);
        }
    }
}

/* Per head: P (n,L) = scale q k^T over the cache's first L = pos0+n rows, row i causal at
 * pos0+i, then y = P v: the rows attention_fwd computes at those positions, by the same steps (equal
 * to rounding: softmax_causal_row's chunks end at the row's length, T there and L here). */
static void cpu_attention_cached(void *ctx, dt_act *out_, dt_act *kc_, dt_act *vc_, float *scratch,
                                 const dt_act *qkv_, int pos0, const dt_att_shape *s) {
    (void)ctx;
    float *out = (float *)out_, *kc = (float *)kc_, *vc = (float *)vc_;
    const float *qkv = (const float *)qkv_;
    const int n = s->T, hs = s->hs, L = pos0 + n, KV = s->NKV * hs;
    const att_dims d = att_dims_of(s);
    const float scale = 1.0f / sqrtf((float)hs);
    for (int i = 0; i < n; i++) {
        memcpy(kc + (size_t)(pos0 + i) * KV, qkv + (size_t)i * d.W + d.koff, (size_t)KV * sizeof(float));
        memcpy(vc + (size_t)(pos0 + i) * KV, qkv + (size_t)i * d.W + d.voff, (size_t)KV * sizeof(float));
    }
#pragma omp parallel for schedule(static) /* single-threaded sgemms for any thread count */
    for (int h = 0; h < s->NH; h++) {
        const int g = h / d.group;
        float *P = scratch + (size_t)h * n * L;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, L, hs, scale, qkv + (size_t)h * hs, d.W,
                    kc + (size_t)g * hs, KV, 0.0f, P, L);
        for (int i = 0; i < n; i++) softmax_causal_row(P + (size_t)i * L, 0, pos0 + i, L);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, hs, L, 1.0f, P, L, vc + (size_t)g * hs, KV, 0.0f,
                    out + (size_t)h * hs, d.HQ);
    }
}

/* One query head's backward: dq, and dk, dv of its key/value head (accumulated when `acc`:
 * the group's later heads). */
static void att_head_bwd(float *dq, float *dk, float *dv, float *dS, const float *q, const float *k, const float *v,
                         const float *P, const float *dO, const dt_att_shape *s, int b, const att_dims *d, float scale,
                         int acc) {
    const int T = s->T, hs = s->hs;
    for (int r0 = 0; r0 < T; r0 += ATT_BLK) {
        const int r1 = imin(T, r0 + ATT_BLK), m = r1 - r0, k0 = att_lo(s, b, r0); /* keys [k0, r1), as forward */
        /* dP = dO V^T, then dS = P * (dP - rowsum(P * dP)) in place */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, r1 - k0, hs, 1.0f, dO + (size_t)r0 * d->HQ, d->HQ,
                    v + (size_t)k0 * d->W, d->W, 0.0f, dS + (size_t)r0 * T + k0, T);
        for (int t = r0; t < r1; t++) softmax_causal_row_bwd(dS + (size_t)t * T, P + (size_t)t * T, att_lo(s, b, t), t, T);
        /* dQ = scale * dS K */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, hs, r1 - k0, scale, dS + (size_t)r0 * T + k0, T,
                    k + (size_t)k0 * d->W, d->W, 0.0f, dq + (size_t)r0 * d->W, d->W);
    }
    for (int c0 = 0; c0 < T; c0 += ATT_BLK) {
        /* keys [c0,c1) receive from queries [c0,T) only; packed rows from those of their examples */
        const int c1 = imin(T, c0 + ATT_BLK), n = c1 - c0, rows = att_hi(s, b, c1) - c0;
        const size_t d0 = (size_t)c0 * T + c0;
        /* dV = P^T dO;  dK = scale * dS^T Q */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, 1.0f, P + d0, T,
                    dO + (size_t)c0 * d->HQ, d->HQ, acc ? 1.0f : 0.0f, dv + (size_t)c0 * d->W, d->W);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, hs, rows, scale, dS + d0, T,
                    q + (size_t)c0 * d->W, d->W, acc ? 1.0f : 0.0f, dk + (size_t)c0 * d->W, d->W);
    }
}

static void cpu_attention_bwd(void *ctx, dt_act *dqkv_, void *datt_, const dt_act *dout_,
                              const dt_act *qkv_, const dt_act *out_, const void *att_, const dt_att_shape *s) {
    (void)out_; /* the probabilities say all backward needs */
    float *dqkv = (float *)dqkv_;
    float *datt = (float *)datt_;
    const float *dout = (const float *)dout_;
    const float *qkv = (const float *)qkv_;
    const float *att = (const float *)att_;
#ifdef DT_HAVE_DNNL
    if (att16_bwd(ctx, dqkv, datt, dout, qkv, att, s)) return;
#else
    (void)ctx;
#endif
    const int T = s->T, NH = s->NH, hs = s->hs;
    const att_dims d = att_dims_of(s);
    const float scale = 1.0f / sqrtf((float)hs);
    /* one (b, key/value head) an iteration, its query heads in order: dk and dv sum them */
#pragma omp parallel for schedule(static) /* even one (b, g): OpenBLAS then runs single-threaded, as always here */
    for (int bg = 0; bg < s->B * s->NKV; bg++) {
        const int b = bg / s->NKV, g = bg % s->NKV;
        const size_t row = (size_t)b * T * d.W;
        for (int j = 0; j < d.group; j++) {
            const int h = g * d.group + j, bh = b * NH + h;
            const size_t qo = row + (size_t)h * hs, ko = row + d.koff + (size_t)g * hs, vo = row + d.voff + (size_t)g * hs;
            att_head_bwd(dqkv + qo, dqkv + ko, dqkv + vo, datt + (size_t)bh * T * T, qkv + qo, qkv + ko, qkv + vo,
                         att + (size_t)bh * T * T, dout + (size_t)b * T * d.HQ + (size_t)h * hs, s, b, &d, scale, j > 0);
        }
    }
}

/* ---- rotary positions ---- */

/* the pairs (i, i + hs/2) of every q and k head of every row rotated by sign * pos * inv_freq[i] */
static void rope_rotate(float *qkv, const float *inv_freq, int pos0, const dt_att_shape *s, float sign) {
    const int hs = s->hs, half = hs / 2, heads = s->NH + s->NKV, W = (s->NH + 2 * s->NKV) * hs;
#pragma omp parallel for schedule(static) if ((size_t)s->B * s->T * heads * hs >= PAR_MIN)
    for (int bt = 0; bt < s->B * s->T; bt++) {
        float cs[512], sn[512]; /* hs <= 1024 (model.c checks) */
        const float pos = (float)(s->pos ? s->pos[bt] : pos0 + bt % s->T);
        for (int i = 0; i < half; i++) {
            const float a = pos * inv_freq[i];
            cs[i] = cosf(a);
            sn[i] = sign * sinf(a);
        }
        float *row = qkv + (size_t)bt * W;
        for (int h = 0; h < heads; h++) { /* the q heads, then the k heads: contiguous */
            float *x = row + (size_t)h * hs;
#pragma omp simd
            for (int i = 0; i < half; i++) {
                const float x1 = x[i], x2 = x[i + half];
                x[i] = x1 * cs[i] - x2 * sn[i];
                x[i + half] = x2 * cs[i] + x1 * sn[i];
            }
        }
    }
}

static void cpu_rope_fwd(void *ctx, dt_act *qkv, const float *inv_freq, int pos0, const dt_att_shape *s) {
    (void)ctx;
    rope_rotate((float *)qkv, inv_freq, pos0, s, 1.0f);
}

static void cpu_rope_bwd(void *ctx, dt_act *dqkv, const float *inv_freq, int pos0, const dt_att_shape *s) {
    (void)ctx;
    rope_rotate((float *)dqkv, inv_freq, pos0, s, -1.0f);
}

/* ---- elementwise ---- */

/* 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), evaluated as the identical
 * x * s, s = 1 / (1 + exp(-2u)): no cancellation in 1 + tanh for x << 0, and vectorizable. */
DT_CLONES
static void gelu_fwd_range(float *out, const float *inp, size_t lo, size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        const float x = inp[i];
        const float e = fast_expf(-2.0f * GELU_K * (x + 0.044715f * x * x * x));
        out[i] = x / (1.0f + e);
    }
}

/* d/dx = 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u' = s + 2 x s (1 - s) u',
 * u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2), and 1 - s = e s. */
DT_CLONES
static void gelu_bwd_range(float *dinp, const float *inp, const float *dout, size_t lo,
                           size_t hi) {
#pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        const float x = inp[i];
        const float e = fast_expf(-2.0f * GELU_K * (x + 0.044715f * x * x * x));
        const float sg = 1.0f / (1.0f + e);
        const float g = sg + 2.0f * x * sg * (e * sg) * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = g * dout[i];
    }
}

static void cpu_gelu_fwd(void *ctx, dt_act *out_, const dt_act *inp_, size_t n) {
    float *out = (float *)out_;
    const float *inp = (const float *)inp_;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t c = 0; c < ew_tasks(n); c++) gelu_fwd_range(out, inp, c * EW_CHUNK, ew_end(c, n));
}

static void cpu_gelu_bwd(void *ctx, dt_act *dinp_, const dt_act *inp_, const dt_act *dout_, size_t n) {
    float *dinp = (float *)dinp_;
    const float *inp = (const float *)inp_;
    const float *dout = (const float *)dout_;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (size_t c = 0; c < ew_tasks(n); c++) gelu_bwd_range(dinp, inp, dout, c * EW_CHUNK, ew_end(c, n));
}

/* SwiGLU over rows [gate | up] of 2I: out = silu(gate) * up, silu(x) = x / (1 + e^-x) */
DT_CLONES
static void swiglu_row_fwd(float *o, const float *gu, int F) {
#pragma omp simd
    for (int i = 0; i < F; i++) {
        const float g = gu[i];
        o[i] = g / (1.0f + fast_expf(-g)) * gu[F + i];
    }
}

/* d silu / dx = s (1 + x (1 - s)), s = 1 / (1 + e^-x) */
DT_CLONES
static void swiglu_row_bwd(float *d, const float *gu, const float *dy, int F) {
#pragma omp simd
    for (int i = 0; i < F; i++) {
        const float g = gu[i], u = gu[F + i], sg = 1.0f / (1.0f + fast_expf(-g));
        d[i] = dy[i] * u * (sg * (1.0f + g * (1.0f - sg)));
        d[F + i] = dy[i] * (g * sg);
    }
}

static void cpu_swiglu_fwd(void *ctx, dt_act *out_, const dt_act *inp_, int N, int F) {
    float *out = (float *)out_;
    const float *inp = (const float *)inp_;
#pragma omp parallel for schedule(static) if ((size_t)N * F >= PAR_MIN)
    for (int r = 0; r < N; r++) swiglu_row_fwd(out + (size_t)r * F, inp + (size_t)r * 2 * F, F);
}

static void cpu_swiglu_bwd(void *ctx, dt_act *dinp_, const dt_act *inp_, const dt_act *dout_, int N, int F) {
    float *dinp = (float *)dinp_;
    const float *inp = (const float *)inp_, *dout = (const float *)dout_;
#pragma omp parallel for schedule(static) if ((size_t)N * F >= PAR_MIN)
    for (int r = 0; r < N; r++)
        swiglu_row_bwd(dinp + (size_t)r * 2 * F, inp + (size_t)r * 2 * F, dout + (size_t)r * F, F);
}

static void cpu_add(void *ctx, dt_act *out_, const dt_act *a_, const dt_act *b_, size_t n) {
    float *out = (float *)out_;
    const float *a = (const float *)a_;
    const float *b = (const float *)b_;
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

/* ---- softmax cross-entropy ---- */

/* probs row (may alias x) = softmax(x); returns -log p[tg] (0 when tg < 0). grad (xent_fused,
 * tg >= 0): the row's gradient instead, p[j] = softmax(x)[j] * scale and p[tg] = (that
 * probability - 1) * scale, the values xent_bwd makes of the probabilities, in the same pass. */
DT_CLONES
static float xent_row_fwd(float *p, const float *x, int tg, int V, int grad, float scale) {
    const int vL = V / LANES * LANES;
    float lane[LANES], mx = x[0];
    for (int l = 0; l < LANES; l++) lane[l] = mx;
    for (int j0 = 0; j0 < vL; j0 += LANES)
#pragma omp simd
        for (int l = 0; l < LANES; l++) lane[l] = x[j0 + l] > lane[l] ? x[j0 + l] : lane[l];
    mx = lanes_max(lane);
    for (int j = vL; j < V; j++) mx = x[j] > mx ? x[j] : mx;
    const float xt = tg >= 0 ? x[tg] - mx : 0.0f; /* read before p overwrites x */
    double sum;
    LANES_SUMD(sum, V, j, p[j] = fast_expf(x[j] - mx));
    const float inv = (float)(1.0 / sum);
    if (grad) {
        const float pt = p[tg] * inv;
#pragma omp simd
        for (int j = 0; j < V; j++) p[j] = p[j] * inv * scale;
        p[tg] = (pt - 1.0f) * scale;
    } else {
#pragma omp simd
        for (int j = 0; j < V; j++) p[j] *= inv;
    }
    return tg >= 0 ? (float)(log(sum) - xt) : 0.0f;
}

static void cpu_xent_fwd(void *ctx, float *losses, dt_act *probs_, const dt_act *logits_,
                         const int *targets, int N, int V, int ld) {
    float *probs = (float *)probs_;
    const float *logits = (const float *)logits_;
#pragma omp parallel for schedule(static) if ((size_t)N * V >= PAR_MIN)
    for (int i = 0; i < N; i++)
        losses[i] = xent_row_fwd(probs + (size_t)i * ld, logits + (size_t)i * ld, targets[i], V, 0, 0.0f);
}

/* xent_fwd and xent_bwd at once (training): each row's gradient made from its probabilities
 * where they are computed, one pass over the logits fewer and one parallel region; the same
 * values as the two calls */
static void cpu_xent_fused(void *ctx, float *losses, dt_act *dlogits_, const dt_act *logits_, const int *targets,
                           float scale, int N, int V, int ld) {
    (void)ctx;
    float *dlogits = (float *)dlogits_;
    const float *logits = (const float *)logits_;
#pragma omp parallel for schedule(static) if ((size_t)N * V >= PAR_MIN)
    for (int i = 0; i < N; i++) {
        float *d = dlogits + (size_t)i * ld;
        if (targets[i] < 0) { /* xent_fwd's loss 0, xent_bwd's zero row */
            losses[i] = 0.0f;
            memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        losses[i] = xent_row_fwd(d, logits + (size_t)i * ld, targets[i], V, 1, scale);
    }
}

static void cpu_xent_bwd(void *ctx, dt_act *dlogits_, const dt_act *probs_, const int *targets,
                         float scale, int N, int V, int ld) {
    float *dlogits = (float *)dlogits_;
    const float *probs = (const float *)probs_;
#pragma omp parallel for schedule(static) if ((size_t)N * V >= PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *p = probs + (size_t)i * ld;
        float *d = dlogits + (size_t)i * ld; /* may be p */
        const int tg = targets[i];
        if (tg < 0) {
            memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        const float pt = p[tg]; /* read before d overwrites p */
#pragma omp simd
        for (int j = 0; j < V; j++) d[j] = p[j] * scale;
        d[tg] = (pt - 1.0f) * scale;
    }
}

/* a share of the cross-entropy (ops.h xent_part_stats, xent_part_bwd) */
/* the sum over x[0, V) of exp(x - mx), in double lanes (see LANES) */
DT_CLONES
static double xent_expsum(const float *x, float mx, int V) {
    double sum;
    LANES_SUMD(sum, V, j, fast_expf(x[j] - mx));
    return sum;
}

static void cpu_xent_part_stats(void *ctx, float *stats, const dt_act *logits_, const int *targets, int v0, int N,
                                int V, int ld) {
    (void)ctx;
    const float *logits = (const float *)logits_;
#pragma omp parallel for schedule(static) if ((size_t)N * V >= PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * ld;
        float mx = x[0];
        int at = 0;
        for (int j = 1; j < V; j++)
            if (x[j] > mx) {
                mx = x[j];
                at = j;
            }
        double sum = xent_expsum(x, mx, V);
        const int k = targets[i] - v0;
        float *st = stats + (size_t)i * 4;
        st[0] = mx;
        st[1] = (float)sum;
        st[2] = targets[i] >= 0 && k >= 0 && k < V ? x[k] : 0.0f;
        st[3] = (float)(v0 + at);
    }
}

static void cpu_xent_part_bwd(void *ctx, dt_act *dlogits_, const dt_act *logits_, const float *lse, const int *targets,
                              int v0, float scale, int N, int V, int ld) {
    (void)ctx;
    float *dlogits = (float *)dlogits_;
    const float *logits = (const float *)logits_;
#pragma omp parallel for schedule(static) if ((size_t)N * V >= PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * ld;
        float *d = dlogits + (size_t)i * ld; /* may be x */
        if (targets[i] < 0) {
            memset(d, 0, (size_t)V * sizeof(float));
            continue;
        }
        const float l = lse[i];
#pragma omp simd
        for (int j = 0; j < V; j++) d[j] = fast_expf(x[j] - l) * scale;
        const int k = targets[i] - v0;
        if (k >= 0 && k < V) d[k] -= scale;
    }
}

/* ---- row gather / scatter ---- */

static void cpu_gather_rows(void *ctx, dt_act *out_, const dt_act *x_, const int *rows, int n, int C) {
    float *out = (float *)out_;
    const float *x = (const float *)x_;
#pragma omp parallel for schedule(static) if ((size_t)n * C >= PAR_MIN)
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * C, x + (size_t)rows[i] * C, (size_t)C * sizeof(float));
}

/* rows may repeat: column chunks in parallel, rows in order within each chunk */
static void cpu_scatter_add_rows(void *ctx, dt_act *dx_, const dt_act *dout_, const int *rows, int n,
                                 int C) {
    float *dx = (float *)dx_;
    const float *dout = (const float *)dout_;
    const int chunk = 2 * COL_CHUNK, nchunks = (C + chunk - 1) / chunk;
#pragma omp parallel for schedule(static) if ((size_t)n * C >= PAR_MIN)
    for (int ch = 0; ch < nchunks; ch++) {
        const int c0 = ch * chunk, nc = imin(chunk, C - c0);
        for (int i = 0; i < n; i++) {
            float *d = dx + (size_t)rows[i] * C + c0;
            const float *g = dout + (size_t)i * C + c0;
#pragma omp simd
            for (int j = 0; j < nc; j++) d[j] += g[j];
        }
    }
}

/* ---- optimizer helpers ---- */

/* torch.optim.AdamW (foreach=False) step: p *= 1 - lr*wd; m = b1 m + (1-b1) g;
 * v = b2 v + (1-b2) g^2; p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps), piece by piece.
 * Element by element in float, each a chain of correctly rounded operations (ops_cpu.c is built
 * with -ffp-contract=off: no FMAs; and -fno-math-errno: sqrt inlined), so every clone gives the
 * same bits. */
DT_CLONES
static void adamw_range(float *p, const float *g, float *m, float *v, size_t lo, size_t hi, float beta1, float beta2,
                        float eps, float decay, float step_size, float bc2_sqrt) {
#pragma omp simd
    for (size_t i = lo; i < hi; i++) {
        const float gi = g[i];
        const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
        const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = p[i] * decay - step_size * mi / (sqrtf(vi) / bc2_sqrt + eps);
    }
}

/* One parallel region over every piece: the pieces' elements, laid end to end, are cut into
 * as many equal stretches as there are threads (at multiples of 16), each thread updating the
 * parts of the pieces its stretch covers. The update is element by element, so the bits do not
 * depend on where the cuts fall; a region a piece left the biases and norms' small pieces on
 * one thread while the other waited. */
static void cpu_adamw(void *ctx, float *p_, const float *g_, float *m_, float *v_, const dt_adamw_piece *pieces,
                      int n_pieces, float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
    (void)ctx;
    const double bc1 = 1.0 - pow((double)beta1, t), bc2 = 1.0 - pow((double)beta2, t);
    const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    size_t total = 0;
    for (int k = 0; k < n_pieces; k++) total += pieces[k].numel;
#pragma omp parallel if (total >= PAR_MIN)
    {
        size_t lo, hi, at = 0; /* at: where piece k starts, end to end */
        thread_stretch(total, 16, &lo, &hi);
        for (int k = 0; k < n_pieces && at < hi; at += pieces[k++].numel) {
            const dt_adamw_piece *pc = &pieces[k];
            const size_t a = lo > at ? lo - at : 0, b = hi - at < pc->numel ? hi - at : pc->numel;
            if (a >= b) continue;
            const float decay = 1.0f - lr * (pc->decay ? weight_decay : 0.0f);
            adamw_range(p_ + pc->offset, g_ + pc->offset, m_ + pc->moff, v_ + pc->moff, a, b, beta1, beta2, eps,
                        decay, step_size, bc2_sqrt);
        }
    }
}

/* SUMSQ_CHUNKS chunks of ceil(n / SUMSQ_CHUNKS), each summed in order in double, added in
 * order. A chunk's sum is one chain of dependent adds, bound by their latency: a task advances
 * SUMSQ_LANES chunks' chains side by side (the same adds in the same order per chunk, so the
 * same bits), then finishes each chunk's own tail. */
DT_CLONES
static void sumsq_lanes(double *part, const float *x, size_t n, size_t chunk, int c0) {
    size_t lo[SUMSQ_LANES], len[SUMSQ_LANES], common = chunk;
    double s[SUMSQ_LANES];
    for (int j = 0; j < SUMSQ_LANES; j++) {
        const size_t a = (size_t)(c0 + j) * chunk < n ? (size_t)(c0 + j) * chunk : n;
        lo[j] = a, len[j] = (a + chunk < n ? a + chunk : n) - a, s[j] = 0.0;
        if (len[j] < common) common = len[j];
    }
    for (size_t i = 0; i < common; i++)
        DT_UNROLL(SUMSQ_LANES) /* the sums stay in registers */
        for (int j = 0; j < SUMSQ_LANES; j++) s[j] += (double)x[lo[j] + i] * x[lo[j] + i];
    for (int j = 0; j < SUMSQ_LANES; j++) {
        for (size_t i = common; i < len[j]; i++) s[j] += (double)x[lo[j] + i] * x[lo[j] + i];
        part[c0 + j] = s[j];
    }
}

static double sumsq_one(const float *x, size_t n) {
    double part[SUMSQ_CHUNKS];
    const size_t chunk = (n + SUMSQ_CHUNKS - 1) / SUMSQ_CHUNKS;
#pragma omp parallel for schedule(static) if (n >= PAR_MIN)
    for (int c = 0; c < SUMSQ_CHUNKS; c += SUMSQ_LANES) sumsq_lanes(part, x, n, chunk, c);
    double total = 0.0;
    for (int c = 0; c < SUMSQ_CHUNKS; c++) total += part[c];
    return total;
}

/* each range's sum as one call of a range would give it, added in order */
static void cpu_sumsq(void *ctx, double *out, const float *x, const dt_range *ranges, int n_ranges) {
    (void)ctx;
    double total = 0.0;
    for (int r = 0; r < n_ranges; r++) total += sumsq_one(x + ranges[r].offset, ranges[r].numel);
    *out = total;
}

static void cpu_scale(void *ctx, float *x_, const dt_range *ranges, int n_ranges, float s) {
    (void)ctx;
    for (int r = 0; r < n_ranges; r++) {
        float *x = x_ + ranges[r].offset;
        const size_t n = ranges[r].numel;
#pragma omp parallel for simd schedule(static) if (n >= PAR_MIN)
        for (size_t i = 0; i < n; i++) x[i] *= s;
    }
}

static void cpu_loss_sum(void *ctx, double *acc, const float *losses, const int *targets, int n) {
    (void)ctx;
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        if (!targets || targets[i] >= 0) sum += losses[i];
    *acc += sum;
}

/* ---- table ---- */

static void cpu_argmax(void *ctx, int *idx, const dt_act *x_, int N, int V, int ld) {
    const float *x = (const float *)x_;
    (void)ctx;
#pragma omp parallel for schedule(static) if ((size_t)N * V >= PAR_MIN)
    for (int i = 0; i < N; i++) {
        const float *r = x + (size_t)i * ld;
        int arg = 0;
        for (int k = 1; k < V; k++)
            if (r[k] > r[arg]) arg = k;
        idx[i] = arg;
    }
}

static void cpu_set_master(void *ctx, const float *params, size_t n) {
    (void)ctx;
    (void)params;
    (void)n;
}

static dt_status cpu_check(void *ctx) {
    (void)ctx;
    return DT_OK;
}

/* ---- lifecycle ---- */

/* unpadded: the CPU backend's memory and results stay what they were (padding is for GPU tiles) */
static int cpu_logits_stride(int V) { return V; }

static dt_dtype cpu_act_dtype(int bf16) {
    (void)bf16;
    return DT_DTYPE_F32;
}

/* everything the CPU backend uses is allocated through alloc: nothing beyond the model's */
/* the floats of the pieces a bf16 weight is widened in */
static size_t panel_floats(const dt_op_sizes *sizes) { return sizes->base16 < PANEL ? sizes->base16 : PANEL; }

/* everything the CPU backend uses is allocated through alloc, but the pieces of bf16 weights */
static size_t cpu_scratch_bytes(const dt_op_sizes *sizes, int bf16) {
    (void)bf16;
    return panel_floats(sizes) * sizeof(float);
}

/* Which library runs the fp32 weight products (DTRAIN_CPU_GEMM, the build, the CPU): 1 oneDNN,
 * 0 OpenBLAS, -1 a value that is neither name. why: what the --version line says. */
static int fp32_on_dnnl(const char **why) {
    const char *gemm = getenv("DTRAIN_CPU_GEMM");
    *why = "oneDNN";
    if (gemm && strcmp(gemm, "openblas") && strcmp(gemm, "onednn")) return -1;
    if (gemm && !strcmp(gemm, "openblas")) {
        *why = "OpenBLAS (DTRAIN_CPU_GEMM=openblas)";
        return 0;
    }
#ifdef DT_HAVE_DNNL
    if ((dnnl_get_effective_cpu_isa() & dnnl_cpu_isa_avx2) != dnnl_cpu_isa_avx2) {
        *why = "OpenBLAS (no AVX2 here)";
        return 0;
    }
    return 1;
#else
    *why = "OpenBLAS (built without oneDNN)";
    return gemm ? -1 : 0; /* DTRAIN_CPU_GEMM=onednn cannot be honoured */
#endif
}

static dt_status cpu_open(const dt_backend_cfg *cfg, void **ctx) {
    *ctx = NULL;
    cpu_ctx *cx = dt_calloc(1, sizeof *cx, "CPU op context");
    if (!cx) return DT_ERR_NOMEM;
    cx->threads = cfg->threads;
    if (cfg->threads > 0) {
        openblas_set_num_threads(cfg->threads);
        omp_set_num_threads(cfg->threads);
    }
    cx->bf16 = cfg->precision > 0; /* auto stays fp32 on CPUs */
    /* fp32 weight products on oneDNN unless DTRAIN_CPU_GEMM=openblas (docs/PERFORMANCE.md: 7-13% off
     * a step on an AVX-512 CPU); not below AVX2, where its fp32 matmul has no JIT kernels, and a
     * product oneDNN has only its reference loops for stays on OpenBLAS too (mm_get) */
    const char *why;
    const int on_dnnl = fp32_on_dnnl(&why);
    if (on_dnnl < 0) {
        free(cx);
        return dt_error_set(DT_ERR_CONFIG, "rank %d: DTRAIN_CPU_GEMM: expected openblas or onednn, got '%s'%s",
                            cfg->rank, getenv("DTRAIN_CPU_GEMM"),
#ifdef DT_HAVE_DNNL
                            "");
#else
                            " (this dtrain was built without oneDNN, so only openblas: apt-get install "
                            "libdnnl-dev and build again for onednn)");
#endif
    }
#ifdef DT_HAVE_DNNL
    cx->f32dnnl = on_dnnl && dnnl_engine_create(&cx->eng, dnnl_cpu, 0) == dnnl_success;
#endif
    if (cx->bf16) {
#ifdef DT_HAVE_DNNL
        const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
        if ((isa & dnnl_cpu_isa_avx512_core_bf16) != dnnl_cpu_isa_avx512_core_bf16) {
            if (cx->eng) dnnl_engine_destroy(cx->eng); /* made above for the fp32 products */
            free(cx);
            return dt_error_set(DT_ERR_CONFIG, "rank %d: training.precision: bf16 on the CPU needs AVX512-BF16 or "
                                "AMX, which this CPU does not have (hint: training.precision: fp32)", cfg->rank);
        }
        if (!cx->eng && dnnl_engine_create(&cx->eng, dnnl_cpu, 0) != dnnl_success) {
            free(cx);
            return dt_error_set(DT_ERR_DEVICE, "rank %d: oneDNN could not open its CPU engine", cfg->rank);
        }
#else
        free(cx);
        return dt_error_set(DT_ERR_CONFIG, "rank %d: training.precision: bf16 on the CPU needs oneDNN, and this "
                            "dtrain was built without it (hint: apt-get install libdnnl-dev and build again, or "
                            "training.precision: fp32)", cfg->rank);
#endif
    }
    *ctx = cx;
    return DT_OK;
}

static void cpu_close(void *ctx) {
    cpu_ctx *cx = ctx;
    if (!cx) return;
    free(cx->panel);
#ifdef DT_HAVE_DNNL
    mm_room(cx, MM16_MAX + 1); /* all dropped */
    for (int i = 0; i < cx->slots; i++) {
        dnnl_stream_destroy(cx->streams[i]);
        free(cx->scratch[i]);
    }
    free(cx->streams);
    free(cx->scratch);
    if (cx->eng) dnnl_engine_destroy(cx->eng);
#endif
    free(cx->a16);
    free(cx->b16);
    free(cx->c16);
    free(cx);
}

static void cpu_describe(void *ctx, dt_backend_desc *d) {
    const cpu_ctx *cx = ctx;
    memset(d, 0, sizeof *d);
    snprintf(d->per_worker, sizeof d->per_worker, "%d threads%s", cx->threads > 0 ? cx->threads : omp_get_max_threads(),
             cx->bf16 ? ", bf16 products" : "");
}

static void cpu_set_threads(void *ctx, int threads) {
    cpu_ctx *cx = ctx;
    if (threads < 1 || threads == cx->threads) return;
    cx->threads = threads;
    openblas_set_num_threads(threads);
    omp_set_num_threads(threads);
}

/* the oneDNN line of `dtrain --version`: its version, and whether this CPU has bf16 products */
static int cpu_versions(char *buf, size_t n) {
#ifdef DT_HAVE_DNNL
    const dnnl_version_t *v = dnnl_version();
    char now[32], built[32];
    snprintf(now, sizeof now, "%d.%d.%d", v->major, v->minor, v->patch);
    snprintf(built, sizeof built, "%d.%d.%d", DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR, DNNL_VERSION_PATCH);
    const dnnl_cpu_isa_t isa = dnnl_get_effective_cpu_isa();
    const char *bf = (isa & dnnl_cpu_isa_avx512_core_amx) == dnnl_cpu_isa_avx512_core_amx     ? "AMX"
                     : (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16 ? "AVX512-BF16"
                                                                                              : NULL;
    const int bad = strcmp(now, built) != 0;
    const char *why;
    fp32_on_dnnl(&why);
    snprintf(buf, n, "  %-9s %s (built with %s)%s, fp32 products: %s, training.precision bf16 on this CPU: %s\n",
             "oneDNN", now, built, bad ? "  MISMATCH" : "", why, bf ? bf : "no (neither AVX512-BF16 nor AMX)");
    return bad;
#else
    snprintf(buf, n, "  %-9s not built in (libdnnl-dev): training.precision bf16 on CPUs is refused\n", "oneDNN");
    return 0;
#endif
}

static int cpu_bf16(void *ctx) {
    (void)ctx;
    return 0;
}

static dt_status cpu_reserve(void *ctx, const dt_op_sizes *sizes) {
    cpu_ctx *cx = ctx;
    const size_t n = panel_floats(sizes);
    if (n <= cx->panel_n) return DT_OK; /* grows: every model's pieces fit */
    free(cx->panel);
    cx->panel = NULL;
    cx->panel_n = 0;
    DT_TRY(cpu_alloc(ctx, n * sizeof(float), "the widened pieces of the bf16 weights", (void **)&cx->panel));
    cx->panel_n = n;
    return DT_OK;
}

const dt_ops dt_ops_cpu = {
    .name = "cpu",
    .memory = NULL,
    .act_dtype = cpu_act_dtype,
    .logits_stride = cpu_logits_stride,
    .scratch_bytes = cpu_scratch_bytes,
    .short_rows = 1,
    .open = cpu_open,
    .close = cpu_close,
    .describe = cpu_describe,
    .versions = cpu_versions,
    .bf16 = cpu_bf16,
    .set_threads = cpu_set_threads,
    .reserve = cpu_reserve,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .upload = cpu_memcpy,
    .download = cpu_memcpy,
    .zero = cpu_zero,
    .copy = cpu_memcpy,
    .upload_async = cpu_memcpy,
    .alloc_host = cpu_alloc, /* host memory for queued copies: any will do here */
    .free_host = cpu_free,
    .download_async = cpu_memcpy,
    .encoder_fwd = cpu_encoder_fwd,
    .encoder_bwd = cpu_encoder_bwd,
    .layernorm_fwd = cpu_layernorm_fwd,
    .layernorm_bwd = cpu_layernorm_bwd,
    .rmsnorm_fwd = cpu_rmsnorm_fwd,
    .rmsnorm_bwd = cpu_rmsnorm_bwd,
    .matmul_fwd = cpu_matmul_fwd,
    .matmul_bwd = cpu_matmul_bwd,
    .matmul16_fwd = cpu_matmul16_fwd,
    .matmul16_bwd = cpu_matmul16_bwd,
    .encoder16_fwd = cpu_encoder16_fwd,
    .attention_bytes = cpu_attention_bytes,
    .attention_fwd = cpu_attention_fwd,
    .attention_bwd = cpu_attention_bwd,
    .attention_cached = cpu_attention_cached,
    .rope_fwd = cpu_rope_fwd,
    .rope_bwd = cpu_rope_bwd,
    .swiglu_fwd = cpu_swiglu_fwd,
    .swiglu_bwd = cpu_swiglu_bwd,
    .lora_fwd = cpu_lora_fwd,
    .lora_bwd = cpu_lora_bwd,
    .gelu_fwd = cpu_gelu_fwd,
    .gelu_bwd = cpu_gelu_bwd,
    .add = cpu_add,
    .xent_fwd = cpu_xent_fwd,
    .xent_bwd = cpu_xent_bwd,
    .xent_fused = cpu_xent_fused,
    .encoder_part_fwd = cpu_encoder_part_fwd,
    .encoder_part_bwd = cpu_encoder_part_bwd,
    .xent_part_stats = cpu_xent_part_stats,
    .xent_part_bwd = cpu_xent_part_bwd,
    .argmax = cpu_argmax,
    .gather_rows = cpu_gather_rows,
    .scatter_add_rows = cpu_scatter_add_rows,
    .adamw = cpu_adamw,
    .sumsq = cpu_sumsq,
    .scale = cpu_scale,
    .loss_sum = cpu_loss_sum,
    .set_master = cpu_set_master,
    .check = cpu_check,
};
