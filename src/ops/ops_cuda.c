/* ops_cuda.c — the CUDA backend: the op table of ops.h on one GPU, and library versions.
 *
 * Matmuls go through cuBLASLt: fp32 in and out with fp32 compute for training.precision fp32;
 * for bf16 the activations themselves are bf16 (act_dtype), the products read them and a bf16
 * working copy of the weights, accumulate in fp32 and write bf16 activations, or fp32 weight
 * gradients; master weights, gradients and optimizer state stay fp32 (cu_act_dtype says what
 * else). Attention is cuDNN's fused attention where it plans (cudnn_att.h), else products in
 * cuBLASLt around our softmax kernels. The rest are our kernels (kernels/dtk.h). Everything runs in order on one stream that this
 * backend owns; the nccl collective it opens (device_comm) orders itself after it.
 *
 * Errors: every CUDA and cuBLASLt call is checked. The op table has no status per call (the
 * CPU backend cannot fail), so the first failure is kept with the call, file:line, rank,
 * host and GPU, later ops do nothing, and `check` (called once a training step, where the
 * step reads its loss and gradient norm, and wherever results come back) returns it. A training
 * step waits for the device there only: its inputs go through pinned staging (upload_async),
 * its loss and norm come back through pinned memory (download_async). An allocation that does not fit names the buffer and the
 * config key to lower, and exits 2: retrying the same shape cannot help; so does a cuBLASLt
 * that cannot be loaded (missing, or older than dtrain was built with): a restart would only
 * fail the same way.
 *
 * cuBLASLt, cuDNN and NCCL are not linked into dtrain: loading cuBLASLt alone costs every
 * process about 150 MB of resident memory, GPU or not (docs/PERFORMANCE.md). cuBLASLt is
 * opened here with dlopen when a GPU op table is made; versions are read the same way, only
 * when asked (--version); their headers give the versions dtrain was built with. */
#include "dtrain/comm.h"
#include "dtrain/ops.h"

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cublasLt.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include "cudnn_att.h"
#include "dtk.h"

/* ---- cuBLASLt, loaded at run time ---- */

#define LT_FUNCS(X)                                                                                       \
    X(cublasLtCreate) X(cublasLtDestroy) X(cublasLtGetStatusString) X(cublasLtMatmul)                  \
    X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy) X(cublasLtMatmulDescSetAttribute)         \
    X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy) X(cublasLtMatrixLayoutSetAttribute)   \
    X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)                               \
    X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic)

static struct {
#define X(f) __typeof__(f) *f;
    LT_FUNCS(X)
#undef X
} lt;
static pthread_once_t lt_once = PTHREAD_ONCE_INIT;
static char lt_error[512]; /* empty when the table is complete */
/* optional, for the plan log only (DTRAIN_LOG_GEMM_PLANS): the algorithm's id, tile and stages */
static __typeof__(cublasLtMatmulAlgoConfigGetAttribute) *lt_algo_attr;

static void lt_load(void) {
    char soname[64];
    snprintf(soname, sizeof soname, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(lt_error, sizeof lt_error, "cannot load %s: %s (hint: install the CUDA %d cuBLAS libraries, or add "
                 "their directory to LD_LIBRARY_PATH)", soname, dlerror(), CUBLAS_VER_MAJOR);
        return;
    }
#define X(f)                                                                                                       \
    if (!(*(void **)&lt.f = dlsym(h, #f))) {                                                                       \
        snprintf(lt_error, sizeof lt_error, "%s has no symbol %s: an older cuBLAS than dtrain was built with "     \
                 "(%d.%d) (hint: install cuBLAS %d.%d or newer, or put its directory first on LD_LIBRARY_PATH)",   \
                 soname, #f, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR);              \
        return;                                                                                                    \
    }
    LT_FUNCS(X)
#undef X
    *(void **)&lt_algo_attr = dlsym(h, "cublasLtMatmulAlgoConfigGetAttribute");
}

/* ---- the backend's state ---- */

/* grow-only scratch buffers, made to their full size by `reserve` before step 1 (growing frees
 * the old one: cudaFree waits for the whole device, NCCL's buckets too); SCR_A32, SCR_B32,
 * SCR_D32: the fp32 operands of a bf16 product cuBLASLt has no bf16 algorithm for, at most
 * fp32_slot_bytes() each (a larger product runs in pieces); SCR_FLAGS: the column reductions'
 * counters (dtk_colsum_flags), zeroed when allocated and left zero by every launch; SCR_MASK:
 * packed rows' attention mask for cuDNN (B,T,T) bf16, written before each fused call */
enum { SCR_A16, SCR_B16, SCR_ATT, SCR_WORK, SCR_CUDNN, SCR_A32, SCR_B32, SCR_D32, SCR_FLAGS, SCR_MASK, N_SCRATCH };

#define LT_WORKSPACE (32u << 20) /* cuBLASLt workspace: 32 MiB, as NVIDIA advises for Hopper */
#define FP32_SLOT (64u << 20)    /* each fp32 operand of a product without a bf16 algorithm, at most */
#define ADAMW_PIECES 4096        /* AdamW's table on the device, made at open: a tensor (or a shard's cut) each */
#define N_RANGES 4096            /* sumsq's and scale's table of ranges on the device, made at open */
#define STAGE_FORWARDS 8         /* upload_async: each half of the staging holds this many forwards' inputs... */
#define STAGE_MIN_HALF (256u << 10) /* ... and at least this (AdamW's and the ranges' tables go through it too) */
#define N_PLANS 96

/* a product's epilogue beyond the bias: none; GELU: D = gelu(AB + bias) and aux = AB + bias;
 * DGELU: D = AB * gelu'(aux) (cuBLASLt's GELU_AUX[_BIAS] and DGELU; aux of D's type, ld `ldaux`);
 * BGRADA: also aux(m) = the sums of op(A)'s rows over k (the bias gradient; of D's type) */
enum { EPI_NONE, EPI_GELU, EPI_DGELU, EPI_BGRADA };

typedef struct gemm_key {
    int ta, tb, m, n, k, lda, ldb, ldd, batch, bias, bf16, d16; /* d16: D (and a bias) in bf16 */
    int epi, ldaux;                                             /* EPI_*, the aux matrix's ld */
    long long sa, sb, sd;
    unsigned align_a, align_b, align_d, align_bias; /* align_bias: 0 without a bias */
    unsigned align_aux;
} gemm_key;

typedef struct gemm_plan {
    gemm_key key;
    int used;
    int none;        /* cuBLASLt has no algorithm for this key (remembered: not asked again) */
    int bias_kernel; /* no bias epilogue for this shape: add the bias with dtk_add_bias */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    size_t ws;       /* the heuristic's workspace and waves, for the plan log */
    float waves;
} gemm_plan;

typedef struct cuda_ctx {
    int device, rank, bf16;
    int noted_fp32;     /* products that found no bf16 algorithm ran in fp32 (said once) */
    char host[64];
    char gpu_name[256];
    char bus_id[32];   /* PCI bus id, NVML's form (dt_backend_desc.bus_id) */
    cudaStream_t s;
    cublasLtHandle_t lt;
    void *lt_ws;
    void *scr[N_SCRATCH];
    size_t scr_bytes[N_SCRATCH];
    /* upload_async's pinned staging: two halves of stage_half bytes; copies are queued out of
     * half stage_cur from offset stage_used on; a full half is marked by its event and the other
     * one taken, waiting for its event first if it was marked since the last check (which
     * empties both). Made at open (STAGE_MIN_HALF), grown by reserve for the inputs. */
    unsigned char *stage;
    size_t stage_half, stage_used;
    int stage_cur, stage_marked[2];
    cudaEvent_t stage_ev[2];
    dtk_range *ranges_dev, *ranges_host; /* sumsq's and scale's table on the device, and what it holds */
    int n_ranges;
    const float *master;/* the model's parameters (set_master), n_master floats */
    size_t n_master;
    dtk_bf16 *shadow;   /* bf16: their working copy, read by the products */
    dtk_adamw_piece *pieces_dev, *pieces_host; /* adamw's table on the device, and what it holds */
    int n_pieces, cap_pieces;
    int shadow_stale;   /* refresh before the next use */
    /* bf16: the output head's weight (head_rows x head_in, inside the master weights) with zero
     * rows up to the logits' padded stride (head_pad rows), made by reserve; its products run at
     * that width. head16_of: the master slice it was copied from (NULL: to copy again) */
    dtk_bf16 *head16;
    const float *head16_of;
    int head_rows, head_in, head_pad;
    /* model.lora.base_dtype bf16: the frozen bf16 head's rows, width and padded rows (op sizes'
     * head_bf16: zero rows follow it in its buffer up to head16_pad), its products run at that
     * width as the padded copy's do; 0 rows: none */
    int base_head_rows, base_head_in, base_head_pad;
    int bf16_only; /* gemm() returns 1, queuing nothing, where it would take the fp32 fallback */
    int head_zeros; /* the head's last forward ran padded: zeros in the logits' padding columns */
    gemm_plan plans[N_PLANS];
    int next_plan;      /* round-robin eviction */
    dtc_att *att;       /* cuDNN's fused attention (cudnn_att.h), opened when first needed */
    struct { dt_att_shape s; int fused; } att_geo[8]; /* what runs each attention geometry: cuDNN or our kernels */
    int n_att_geo, att_noted;
    int inference; /* dt_backend_cfg's: attention plans the forward only until a backward comes */
    int enc_vocab;      /* the largest dt_op_sizes.enc_vocab reserved: encoder_bwd's tokens are below it (0: none) */
    dt_status err;      /* first failure (DT_OK while healthy) */
    char err_msg[1024];
} cuda_ctx;

__attribute__((format(printf, 3, 4))) static void fail(cuda_ctx *c, dt_status st, const char *fmt, ...) {
    if (c->err != DT_OK) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
    va_end(ap);
    c->err = st;
}

/* CUDA and cuBLASLt call checks: record the first failure, return non-zero on failure. */
static int ck_cuda(cuda_ctx *c, cudaError_t e, const char *call, const char *file, int line) {
    if (e == cudaSuccess) return 0;
    fail(c, DT_ERR_DEVICE, "%s failed at %s:%d on rank %d (host %s, GPU %d): %s (%s)", call, file, line, c->rank,
         c->host, c->device, cudaGetErrorString(e), cudaGetErrorName(e));
    return 1;
}
static const char *lt_status_name(cublasStatus_t e) {
    return lt.cublasLtGetStatusString ? lt.cublasLtGetStatusString(e) : "cuBLASLt error";
}

static int ck_lt(cuda_ctx *c, cublasStatus_t e, const char *call, const char *file, int line) {
    if (e == CUBLAS_STATUS_SUCCESS) return 0;
    fail(c, DT_ERR_DEVICE, "%s failed at %s:%d on rank %d (host %s, GPU %d): %s", call, file, line, c->rank, c->host,
         c->device, lt_status_name(e));
    return 1;
}
#define CK(call) ck_cuda(c, (call), #call, __FILE__, __LINE__)
#define CKLT(call) ck_lt(c, (call), #call, __FILE__, __LINE__)

static void human_bytes(char *buf, size_t n, double b) {
    if (b >= 1024.0 * 1024 * 1024) snprintf(buf, n, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else snprintf(buf, n, "%.1f MiB", b / (1024.0 * 1024));
}

/* cudaMalloc that names the buffer when it does not fit (DT_ERR_CONFIG: exit 2, no retry). */
static dt_status dev_malloc(cuda_ctx *c, void **p, size_t bytes, const char *what) {
    *p = NULL;
    if (bytes == 0) bytes = 1;
    cudaError_t e = cudaMalloc(p, bytes);
    if (e == cudaSuccess) return DT_OK;
    *p = NULL;
    (void)cudaGetLastError(); /* an allocation failure is not sticky: clear it */
    size_t freeb = 0, total = 0;
    cudaMemGetInfo(&freeb, &total);
    char want[32], fr[32], tot[32];
    human_bytes(want, sizeof want, (double)bytes);
    human_bytes(fr, sizeof fr, (double)freeb);
    human_bytes(tot, sizeof tot, (double)total);
    if (e == cudaErrorMemoryAllocation)
        return dt_error_set(DT_ERR_CONFIG, "rank %d (host %s, GPU %d %s): out of GPU memory allocating %s for %s (%s "
                            "free of %s) (hint: lower data.batch_size_per_worker and raise "
                            "training.grad_accum_steps to keep the global batch, or use a shorter data.seq_len)",
                            c->rank, c->host, c->device, c->gpu_name, want, what, fr, tot);
    return dt_error_set(DT_ERR_DEVICE, "cudaMalloc of %s for %s failed on rank %d (host %s, GPU %d): %s", want, what,
                        c->rank, c->host, c->device, cudaGetErrorString(e));
}

/* what a scratch slot of `bytes` takes: whole MiB, fewer regrowths */
static size_t slot_round(size_t bytes) { return (bytes + 0xFFFFF) & ~(size_t)0xFFFFF; }

/* Scratch slot `i` with at least `bytes` (grown, never shrunk); NULL after a failure. */
static void *scratch(cuda_ctx *c, int i, size_t bytes, const char *what) {
    if (c->err != DT_OK) return NULL;
    if (c->scr_bytes[i] >= bytes && c->scr[i]) return c->scr[i];
    if (c->scr[i] && CK(cudaFree(c->scr[i]))) return NULL; /* cudaFree waits for the queued work */
    c->scr[i] = NULL;
    c->scr_bytes[i] = 0;
    bytes = slot_round(bytes);
    dt_status st = dev_malloc(c, &c->scr[i], bytes, what);
    if (st != DT_OK) {
        fail(c, st, "%s", dt_error_msg());
        return NULL;
    }
    c->scr_bytes[i] = bytes;
    if (i == SCR_FLAGS && CK(cudaMemsetAsync(c->scr[i], 0, bytes, c->s))) return NULL;
    return c->scr[i];
}

/* the counters of a column reduction over n columns */
static unsigned *col_flags(cuda_ctx *c, int n) {
    return scratch(c, SCR_FLAGS, (size_t)dtk_colsum_flags(n) * sizeof(unsigned), "the column reductions' counters");
}

/* ---- memory ---- */

static dt_status cu_alloc(void *ctx, size_t bytes, const char *what, void **out) {
    cuda_ctx *c = ctx;
    *out = NULL;
    if (c->err != DT_OK) return dt_error_set(c->err, "%s", c->err_msg);
    DT_TRY(dev_malloc(c, out, bytes, what));
    if (CK(cudaMemsetAsync(*out, 0, bytes, c->s))) {
        cudaFree(*out);
        *out = NULL;
        return dt_error_set(c->err, "%s", c->err_msg);
    }
    return DT_OK;
}

static void cu_free(void *ctx, void *p) {
    cuda_ctx *c = ctx;
    if (p) CK(cudaFree(p));
}

/* Does [p, p + bytes) overlap the master weights? */
static int touches_master(const cuda_ctx *c, const void *p, size_t bytes) {
    const char *a = p, *m = (const char *)c->master;
    return c->master && a < m + c->n_master * sizeof(float) && m < a + bytes;
}

static void cu_upload(void *ctx, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = ctx;
    if (touches_master(c, dst, bytes)) c->shadow_stale = 1;
    if (c->err != DT_OK || bytes == 0) return;
    /* synchronous: the caller may reuse its host buffer at once */
    if (CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->s))) return;
    CK(cudaStreamSynchronize(c->s));
}

/* The stream is idle (a synchronisation): every staged copy has run. */
static void stage_drained(cuda_ctx *c) {
    c->stage_used = 0;
    c->stage_marked[0] = c->stage_marked[1] = 0;
}

/* src's bytes into the pinned staging, copied from there to dst on the stream (ordered like an
 * op): nothing waits unless more than a half of the staging was queued since the last check;
 * without staging room (bytes over a half), a synchronous copy. upload_async's work. */
static void stage_upload(cuda_ctx *c, void *dst, const void *src, size_t bytes) {
    if (c->err != DT_OK || bytes == 0) return;
    const size_t need = (bytes + 255) & ~(size_t)255; /* each copy's source 256-byte aligned */
    if (!c->stage || need > c->stage_half) {
        if (!CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->s)) && !CK(cudaStreamSynchronize(c->s)))
            stage_drained(c);
        return;
    }
    if (c->stage_used + need > c->stage_half) { /* this half is full: mark it, take the other */
        if (CK(cudaEventRecord(c->stage_ev[c->stage_cur], c->s))) return;
        c->stage_marked[c->stage_cur] = 1;
        c->stage_cur ^= 1;
        c->stage_used = 0;
        if (c->stage_marked[c->stage_cur] && CK(cudaEventSynchronize(c->stage_ev[c->stage_cur]))) return;
        c->stage_marked[c->stage_cur] = 0;
    }
    unsigned char *at = c->stage + (size_t)c->stage_cur * c->stage_half + c->stage_used;
    memcpy(at, src, bytes);
    if (CK(cudaMemcpyAsync(dst, at, bytes, cudaMemcpyHostToDevice, c->s))) return;
    c->stage_used += need;
}

/* A half of the staging for halves of `want` bytes: want, or DTRAIN_TEST_STAGE_BYTES (a test
 * switch: a small one makes a step wrap around the staging, waiting for the device's copies) */
static size_t stage_half_bytes(size_t want) {
    const char *e = getenv("DTRAIN_TEST_STAGE_BYTES");
    return e && atol(e) >= 256 ? (size_t)atol(e) : want;
}

/* The staging at halves of `half` bytes (at least what it is): the old one freed first (nothing
 * may still copy out of it). */
static dt_status stage_grow(cuda_ctx *c, size_t half) {
    half = stage_half_bytes(half);
    if (c->stage && half <= c->stage_half) return DT_OK;
    if (c->stage) {
        if (CK(cudaStreamSynchronize(c->s)) || CK(cudaFreeHost(c->stage))) return dt_error_set(c->err, "%s", c->err_msg);
        c->stage = NULL;
        c->stage_half = 0;
    }
    stage_drained(c);
    if (CK(cudaHostAlloc((void **)&c->stage, 2 * half, cudaHostAllocDefault))) {
        c->stage = NULL;
        return dt_error_set(c->err, "%s", c->err_msg);
    }
    c->stage_half = half;
    return DT_OK;
}

static void cu_upload_async(void *ctx, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = ctx;
    if (touches_master(c, dst, bytes)) c->shadow_stale = 1;
    stage_upload(c, dst, src, bytes);
}

static dt_status cu_alloc_host(void *ctx, size_t bytes, const char *what, void **out) {
    cuda_ctx *c = ctx;
    *out = NULL;
    const cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        *out = NULL;
        (void)cudaGetLastError(); /* an allocation failure is not sticky */
        return dt_error_set(DT_ERR_NOMEM, "cudaHostAlloc of %zu bytes for %s failed on rank %d (host %s): %s", bytes,
                            what, c->rank, c->host, cudaGetErrorString(e));
    }
    memset(*out, 0, bytes);
    return DT_OK;
}

static void cu_free_host(void *ctx, void *p) {
    cuda_ctx *c = ctx;
    if (p) CK(cudaFreeHost(p));
}

/* into pinned memory: nothing waits; `check` does */
static void cu_download_async(void *ctx, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = ctx;
    if (c->err != DT_OK) {
        memset(dst, 0, bytes); /* defined contents; `check` reports the failure */
        return;
    }
    if (bytes && CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->s))) memset(dst, 0, bytes);
}

static void cu_download(void *ctx, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = ctx;
    if (c->err != DT_OK) {
        memset(dst, 0, bytes); /* defined contents; `check` reports the failure */
        return;
    }
    if (bytes == 0) return;
    if (CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->s)) || CK(cudaStreamSynchronize(c->s)))
        memset(dst, 0, bytes);
}

static void cu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    cuda_ctx *c = ctx;
    if (touches_master(c, dst, bytes)) c->shadow_stale = 1;
    if (c->err == DT_OK && bytes) CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, c->s));
}

static void cu_zero(void *ctx, void *p, size_t bytes) {
    cuda_ctx *c = ctx;
    if (touches_master(c, p, bytes)) c->shadow_stale = 1;
    if (c->err == DT_OK && bytes) CK(cudaMemsetAsync(p, 0, bytes, c->s));
}

/* ---- matrix products ---- */

static unsigned ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && (a % al) != 0) al /= 2;
    return al;
}

/* what every product of a batch can be promised: the first's alignment, or the stride's in
 * bytes where that is less (each starts `stride` elements of `esize` bytes after the last) */
static unsigned batch_align(const void *p, int batch, long long stride, size_t esize) {
    unsigned al = ptr_align(p), sal = ptr_align((const void *)(uintptr_t)((size_t)stride * esize));
    return batch > 1 && sal < al ? sal : al;
}

static void plan_release(gemm_plan *p) {
    if (!p->used) return;
    if (p->op) lt.cublasLtMatmulDescDestroy(p->op);
    if (p->la) lt.cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) lt.cublasLtMatrixLayoutDestroy(p->lb);
    if (p->ld) lt.cublasLtMatrixLayoutDestroy(p->ld);
    memset(p, 0, sizeof *p);
}

static int make_layout(cuda_ctx *c, cublasLtMatrixLayout_t *l, cudaDataType_t type, int rows, int cols, int ld,
                       int batch, long long stride) {
    if (CKLT(lt.cublasLtMatrixLayoutCreate(l, type, (uint64_t)rows, (uint64_t)cols, ld))) return 1;
    if (batch > 1) {
        int32_t bc = batch;
        int64_t st = stride;
        if (CKLT(lt.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &bc, sizeof bc))) return 1;
        if (CKLT(lt.cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &st, sizeof st)))
            return 1;
    }
    return 0;
}

/* DTRAIN_LOG_GEMM_PLANS=1: each cuBLASLt plan, once, as it is made, each refusal, and cuDNN's
 * attention plan with its workspace (gpu-check.sh's benchmark log) */
static int log_plans(void) {
    static int on = -1;
    if (on < 0) on = getenv("DTRAIN_LOG_GEMM_PLANS") && strcmp(getenv("DTRAIN_LOG_GEMM_PLANS"), "1") == 0;
    return on;
}

/* DTRAIN_REQUIRE_FAST_PATH=1 (gpu-check.sh on sm_90 with bf16): a fallback that would make a run
 * pass and still be slow is an error naming it, not a note: attention on dtrain's kernels where
 * every cuDNN supports the head size (multiples of 8 up to 128), a bf16 product in fp32 */
static int require_fast_path(void) {
    static int on = -1;
    if (on < 0) on = getenv("DTRAIN_REQUIRE_FAST_PATH") && strcmp(getenv("DTRAIN_REQUIRE_FAST_PATH"), "1") == 0;
    return on;
}

/* each fp32 fallback operand's slot: FP32_SLOT, or DTRAIN_TEST_FP32_SLOT_BYTES (a test switch: a
 * small one runs every fallback product in pieces) */
static size_t fp32_slot_bytes(void) {
    static size_t b;
    if (!b) {
        const char *e = getenv("DTRAIN_TEST_FP32_SLOT_BYTES");
        b = e && atol(e) >= 64 ? (size_t)atol(e) : FP32_SLOT;
    }
    return b;
}

static const char *epi_name(int epi) {
    return epi == EPI_GELU ? ", GELU epilogue" : epi == EPI_DGELU ? ", DGELU epilogue"
           : epi == EPI_BGRADA ? ", BGRADA epilogue" : "";
}

/* Descriptors and the heuristic's first algorithm for key `k`; with_bias 0 asks without the
 * bias epilogue. `bias` is the bias of this call: the heuristic reads the pointer's alignment
 * (cublasLt.h, CUBLASLT_MATMUL_DESC_BIAS_POINTER), and the key holds that alignment, so later
 * calls that reuse the plan have equally aligned biases. Returns 0 on success, 1 when
 * cuBLASLt has no algorithm (not an error yet), -1 on a failed call (recorded). */
static int plan_build(cuda_ctx *c, gemm_plan *p, const gemm_key *k, int with_bias, const void *bias, const void *aux) {
    memset(p, 0, sizeof *p);
    p->used = 1;
    p->key = *k;
    cudaDataType_t ab = k->bf16 ? CUDA_R_16BF : CUDA_R_32F, dt = k->d16 ? CUDA_R_16BF : CUDA_R_32F;
    if (CKLT(lt.cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F))) return -1;
    cublasOperation_t ta = k->ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = k->tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    if (CKLT(lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta))) return -1;
    if (CKLT(lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb))) return -1;
    cublasLtEpilogue_t epi = k->epi == EPI_GELU ? (with_bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                             : k->epi == EPI_DGELU ? CUBLASLT_EPILOGUE_DGELU
                             : k->epi == EPI_BGRADA ? CUBLASLT_EPILOGUE_BGRADA
                             : with_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    if (epi != CUBLASLT_EPILOGUE_DEFAULT &&
        CKLT(lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi)))
        return -1;
    if (with_bias || k->epi == EPI_BGRADA) { /* BGRADA writes its bias gradient where a bias is read */
        cudaDataType_t bt = dt; /* cuBLASLt: the bias is of D's type */
        const void *bp = k->epi == EPI_BGRADA ? aux : bias;
        if (CKLT(lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt)))
            return -1;
        if (CKLT(lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp)))
            return -1;
    }
    if (k->epi == EPI_GELU || k->epi == EPI_DGELU) { /* the aux matrix: of D's type (cuBLASLt's default), set per call too */
        const int64_t ldaux = k->ldaux;
        if (CKLT(lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ldaux, sizeof ldaux)) ||
            CKLT(lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux)))
            return -1;
    }
    /* stored shapes: op(A) is m x k, so A is k x m when transposed */
    if (make_layout(c, &p->la, ab, k->ta ? k->k : k->m, k->ta ? k->m : k->k, k->lda, k->batch, k->sa)) return -1;
    if (make_layout(c, &p->lb, ab, k->tb ? k->n : k->k, k->tb ? k->k : k->n, k->ldb, k->batch, k->sb)) return -1;
    if (make_layout(c, &p->ld, dt, k->m, k->n, k->ldd, k->batch, k->sd)) return -1;

    cublasLtMatmulPreference_t pref = NULL;
    if (CKLT(lt.cublasLtMatmulPreferenceCreate(&pref))) return -1;
    uint64_t ws = LT_WORKSPACE;
    uint32_t al_a = k->align_a, al_b = k->align_b, al_d = k->align_d;
    int r = -1;
    if (!CKLT(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws)) &&
        !CKLT(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a)) &&
        !CKLT(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b)) &&
        !CKLT(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_d, sizeof al_d)) &&
        !CKLT(lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_d, sizeof al_d))) {
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        memset(&res, 0, sizeof res);
        cublasStatus_t hs = lt.cublasLtMatmulAlgoGetHeuristic(c->lt, p->op, p->la, p->lb, p->ld, p->ld, pref, 1, &res,
                                                              &found);
        if (hs == CUBLAS_STATUS_SUCCESS && found > 0) {
            p->algo = res.algo;
            p->ws = res.workspaceSize;
            p->waves = res.wavesCount;
            r = 0;
        } else if (hs == CUBLAS_STATUS_SUCCESS || hs == CUBLAS_STATUS_NOT_SUPPORTED ||
                   with_bias || k->epi != EPI_NONE) {
            /* an epilogue refused with an error status (INVALID_VALUE, for a combination of
             * types and epilogue this cuBLASLt lacks) is refused too: the unfused path */
            r = 1;
            if (log_plans())
                fprintf(stderr, "dtrain: rank %d: cuBLASLt: no algorithm for m %d n %d k %d, trans %d%d, batch %d, "
                        "%s in / %s out%s%s (%s)\n", c->rank, k->m, k->n, k->k, k->ta, k->tb, k->batch,
                        k->bf16 ? "bf16" : "fp32", k->d16 ? "bf16" : "fp32", with_bias ? ", bias epilogue" : "",
                        epi_name(k->epi), lt_status_name(hs));
        } else {
            CKLT(hs);
        }
    }
    lt.cublasLtMatmulPreferenceDestroy(pref);
    return r;
}

/* DTRAIN_LOG_GEMM_PLANS=1: each plan, once, as it is made (gpu-check.sh's benchmark log): the
 * shape, the types, the epilogue, the alignments and what cuBLASLt chose. */
static void log_plan(const cuda_ctx *c, const gemm_plan *p) {
    if (!log_plans()) return;
    const gemm_key *k = &p->key;
    char algo[96] = "";
    int id = -1, tile = -1, stages = -1;
    size_t w;
    if (lt_algo_attr && lt_algo_attr(&p->algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &w) == CUBLAS_STATUS_SUCCESS) {
        lt_algo_attr(&p->algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &w);
        lt_algo_attr(&p->algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof stages, &w);
        snprintf(algo, sizeof algo, "algo %d tile %d stages %d, ", id, tile, stages);
    }
    fprintf(stderr, "dtrain: rank %d: cuBLASLt plan: m %d n %d k %d, trans %d%d, batch %d, %s in / %s out, %s%s, "
            "alignment A %u B %u D %u%s%.0u%s%.0u: %sworkspace %zu, waves %.2f\n", c->rank, k->m, k->n, k->k, k->ta,
            k->tb, k->batch, k->bf16 ? "bf16" : "fp32", k->d16 ? "bf16" : "fp32",
            !k->bias ? "no bias" : p->bias_kernel ? "bias kernel" : "bias epilogue",
            epi_name(k->epi), k->align_a,
            k->align_b, k->align_d, k->bias ? " bias " : "", k->bias ? k->align_bias : 0u, k->epi ? " aux " : "",
            k->epi ? k->align_aux : 0u, algo, p->ws, (double)p->waves);
}

/* The plan for key `k`, made when new; NULL after a failed call (recorded), or with *none = 1
 * when cuBLASLt has no algorithm for it (remembered, nothing recorded: the caller decides). */
static gemm_plan *plan_get(cuda_ctx *c, const gemm_key *k, const void *bias, const void *aux, int *none) {
    *none = 0;
    for (int i = 0; i < N_PLANS; i++)
        if (c->plans[i].used && memcmp(&c->plans[i].key, k, sizeof *k) == 0) {
            *none = c->plans[i].none;
            return *none ? NULL : &c->plans[i];
        }
    gemm_plan *p = &c->plans[c->next_plan];
    c->next_plan = (c->next_plan + 1) % N_PLANS;
    plan_release(p);
    /* a bias vector or aux matrix under 16-byte alignment, or an aux ld not divisible by 8: the
     * bias kernel (epilogues load them vectorized), or no such epilogue (asked for anyway, a
     * heuristic may answer INVALID_VALUE, which would stop the run) */
    const int unaligned = (k->bias && k->align_bias < 16) || (k->epi != EPI_NONE && k->align_aux < 16) ||
                          ((k->epi == EPI_GELU || k->epi == EPI_DGELU) && k->ldaux % 8); /* cuBLASLt's rule */
    int r = unaligned ? 1 : plan_build(c, p, k, k->bias, bias, aux);
    if (r == 1 && k->bias && k->epi == EPI_NONE) { /* no bias epilogue for this shape: plain product + bias kernel */
        plan_release(p);
        r = plan_build(c, p, k, 0, NULL, NULL);
        p->bias_kernel = 1;
    }
    if (r == 0) {
        log_plan(c, p);
        return p;
    }
    plan_release(p);
    if (r == 1) { /* a negative entry: the next call of this shape does not ask again */
        p->used = 1;
        p->key = *k;
        p->none = 1;
        *none = 1;
    }
    return NULL;
}

/* The bf16 working copy of the master weights, refreshed when stale; NULL when there is
 * none (fp32, or before set_master) or after a failure. */
static dtk_bf16 *fresh_shadow(cuda_ctx *c) {
    if (!c->shadow || c->err != DT_OK) return NULL;
    if (c->shadow_stale && CK(dtk_cast_bf16(c->s, c->shadow, c->master, c->n_master))) return NULL;
    if (c->shadow_stale) c->head16_of = NULL;
    c->shadow_stale = 0;
    return c->shadow;
}

/* The padded bf16 head for a product of W (N,K) at rows `ldo` apart, when w is the head that
 * reserve made it for (else NULL: the product as it is). cuBLASLt chose its slow generic kernel
 * for GPT-2's 50257-row head on the H200 (13 ms of a 63 ms step for the logits alone); at the
 * padded 50304 rows its Hopper kernels run. The copy follows the working copy of the weights
 * (a device-to-device copy of N x K elements, after each refresh or update); the padding rows
 * stay zero from reserve. */
static const dtk_bf16 *head_padded(cuda_ctx *c, const float *w, int N, int K, int ldo) {
    if (!c->head16 || N != c->head_rows || K != c->head_in || ldo != c->head_pad || !c->shadow || w < c->master ||
        w + (size_t)N * K > c->master + c->n_master)
        return NULL;
    const dtk_bf16 *sh = fresh_shadow(c);
    if (!sh) return NULL;
    if (c->head16_of != w && CK(cudaMemcpyAsync(c->head16, sh + (w - c->master), (size_t)N * K * sizeof(dtk_bf16),
                                                 cudaMemcpyDeviceToDevice, c->s)))
        return NULL;
    c->head16_of = w;
    return c->head16;
}

static void cu_set_master(void *ctx, const float *params, size_t n) {
    cuda_ctx *c = ctx;
    if (!params) { /* the model is going away: its address range may be reused */
        if (c->shadow) CK(cudaFree(c->shadow));
        c->shadow = NULL;
        c->master = NULL;
        c->n_master = 0;
        return;
    }
    if (c->err != DT_OK) return;
    if (c->bf16 && (!c->shadow || n != c->n_master)) {
        if (c->shadow && CK(cudaFree(c->shadow))) return;
        c->shadow = NULL;
        dt_status st = dev_malloc(c, (void **)&c->shadow, n * sizeof(dtk_bf16), "the bf16 copy of the weights");
        if (st != DT_OK) {
            fail(c, st, "%s", dt_error_msg());
            return;
        }
    }
    c->master = params;
    c->n_master = n;
    c->shadow_stale = 1;
}

/* bf16 copy of `n` floats from `src` into scratch slot `slot`; NULL after a failure. */
static const void *to_bf16(cuda_ctx *c, int slot, const float *src, size_t n) {
    dtk_bf16 *d = scratch(c, slot, n * sizeof(dtk_bf16), "bf16 matmul inputs");
    if (!d || CK(dtk_cast_bf16(c->s, d, src, n))) return NULL;
    return d;
}

/* bf16 input for a product: the slice of the weights' working copy when `src` (n floats)
 * lies inside the master weights, else a bf16 rounding of `src` into scratch slot `slot`. */
static const void *bf16_input(cuda_ctx *c, int slot, const float *src, size_t n) {
    if (c->shadow && src >= c->master && src + n <= c->master + c->n_master) {
        const dtk_bf16 *w = fresh_shadow(c);
        return w ? w + (src - c->master) : NULL;
    }
    return to_bf16(c, slot, src, n);
}

/* fp32 copy of n bf16 elements into scratch slot `slot`; NULL after a failure */
static const float *widened(cuda_ctx *c, int slot, const void *src, size_t n) {
    float *d = scratch(c, slot, n * sizeof(float), "fp32 matmul operands");
    if (!d || CK(dtk_widen_bf16(c->s, d, src, n))) return NULL;
    return d;
}

/* An epilogue for gemm(): EPI_GELU or EPI_DGELU with its aux matrix (m x n, ld `ldaux`, of D's
 * type: written by GELU, read by DGELU), or EPI_BGRADA with the vector (m, of D's type) it writes. */
typedef struct gemm_epi {
    int kind;
    void *aux;
    int ldaux;
} gemm_epi;

static int gemm(cuda_ctx *c, int ta, int tb, int m, int n, int k, const void *A, int a16, int lda, long long sa,
                const void *B, int b16, int ldb, long long sb, void *D, int d16, int ldd, long long sd, int batch,
                float alpha, float beta, const float *bias, const gemm_epi *e);

/* The fp32 fallback of a product whose operands do not fit their slots (fp32_slot_bytes each):
 * gemm() on pieces that do, which take the fallback again (or a bf16 plan, where cuBLASLt has
 * one for the piece's shape). Along n when B is not transposed (the forward and input-gradient
 * products: B's and D's columns lie one after another, A is the weights, not widened); along k
 * for an fp32 D with tb (the weight gradients: A's and B's columns), each piece adding onto
 * what the last wrote. Returns 0 (a failure is recorded). */
static int gemm_pieces(cuda_ctx *c, int ta, int tb, int m, int n, int k, const void *A, int a16, int lda,
                       const void *B, int b16, int ldb, void *D, int d16, int ldd, int batch, float alpha, float beta,
                       const float *bias) {
    const size_t slot = fp32_slot_bytes() / sizeof(float), es_a = a16 ? 2 : 4, es_b = b16 ? 2 : 4;
    const size_t na = (size_t)lda * (size_t)(ta ? m : k);
    if (batch == 1 && !tb && (!a16 || na <= slot)) {
        const size_t per = (size_t)(b16 ? ldb : 1) > (size_t)(d16 ? ldd : 1) ? (size_t)(b16 ? ldb : 1)
                                                                                : (size_t)(d16 ? ldd : 1);
        const int cols = slot / per > (size_t)n ? n : (int)(slot / per);
        for (int j = 0; cols > 0 && j < n && c->err == DT_OK; j += cols)
            gemm(c, ta, tb, m, n - j < cols ? n - j : cols, k, A, a16, lda, 0, (const char *)B + (size_t)j * ldb * es_b,
                 b16, ldb, 0, (char *)D + (size_t)j * ldd * (d16 ? 2 : 4), d16, ldd, 0, 1, alpha, beta, bias, NULL);
        if (cols > 0) return 0;
    } else if (batch == 1 && !ta && tb && !d16 && !bias) {
        const size_t per = (size_t)(a16 ? lda : 1) > (size_t)(b16 ? ldb : 1) ? (size_t)(a16 ? lda : 1)
                                                                                : (size_t)(b16 ? ldb : 1);
        const int cols = slot / per > (size_t)k ? k : (int)(slot / per);
        for (int j = 0; cols > 0 && j < k && c->err == DT_OK; j += cols)
            gemm(c, ta, tb, m, n, k - j < cols ? k - j : cols, (const char *)A + (size_t)j * lda * es_a, a16, lda, 0,
                 (const char *)B + (size_t)j * ldb * es_b, b16, ldb, 0, D, 0, ldd, 0, 1, alpha, j ? 1.0f : beta, NULL,
                 NULL);
        if (cols > 0) return 0;
    }
    fail(c, DT_ERR_INTERNAL, "gemm: an fp32 fallback of %dx%dx%d (trans %d%d, batch %d) in pieces of %zu bytes is not "
         "supported", m, n, k, ta, tb, batch, fp32_slot_bytes());
    return 0;
}

/* the elements a column-major rows x cols matrix of leading dimension ld spans */
static size_t span(int ld, int rows, int cols) { return cols > 0 ? (size_t)ld * (size_t)(cols - 1) + (size_t)rows : 0; }

/* Column-major D(m x n, ldd) = alpha op(A) op(B) + beta D [+ bias(m) on every column], over
 * `batch` products with element strides sa, sb, sd. A is stored k x m when ta (else m x k),
 * B n x k when tb (else k x n), densely (ld = stored rows). a16, b16, d16: A, B, D hold bf16
 * elements (bf16 activations; a bf16 D with beta: added onto, rounded once); otherwise floats, which bf16 products read
 * as the weights' working copy (inside the master weights) or rounded into scratch. e: NULL,
 * or an epilogue (batch 1; a bias only with GELU; beta 0 but for BGRADA). Returns 1, having queued nothing,
 * when cuBLASLt has no algorithm with that epilogue here (the caller runs the product and its
 * kernel instead); else 0 (a failure is recorded). */
static int gemm(cuda_ctx *c, int ta, int tb, int m, int n, int k, const void *A, int a16, int lda, long long sa,
                const void *B, int b16, int ldb, long long sb, void *D, int d16, int ldd, long long sd, int batch,
                float alpha, float beta, const float *bias, const gemm_epi *e) {
    if (c->err != DT_OK || m == 0 || n == 0) return 0;
    if (e && (batch != 1 || (beta != 0.0f && e->kind != EPI_BGRADA) || (bias && e->kind != EPI_GELU))) {
        fail(c, DT_ERR_INTERNAL, "gemm: epilogue %d with batch %d, beta %g%s", e->kind, batch, (double)beta,
             bias ? ", a bias" : "");
        return 0;
    }
    /* the elements each operand spans: up to its last column's last row (a block of a larger
     * matrix, such as the rows k0.. of an activation, ends there, not ld past it) */
    const size_t na = (size_t)sa * (size_t)(batch - 1) + span(lda, ta ? k : m, ta ? m : k);
    const size_t nb = (size_t)sb * (size_t)(batch - 1) + span(ldb, tb ? n : k, tb ? k : n);
    const size_t nd = (size_t)sd * (size_t)(batch - 1) + span(ldd, m, n);
    const void *a = A, *b = B, *pb = bias; /* what cuBLASLt reads */
    if (c->bf16) {
        if ((!a16 && !(a = bf16_input(c, SCR_A16, A, na))) || (!b16 && !(b = bf16_input(c, SCR_B16, B, nb)))) return 0;
        /* a bf16 D takes a bf16 bias: its slice of the weights' working copy, else the bias kernel */
        if (bias && d16) pb = c->shadow && bias >= c->master && bias + m <= c->master + c->n_master && fresh_shadow(c)
                                  ? (const void *)(c->shadow + (bias - c->master)) : NULL;
    }
    gemm_key key;
    memset(&key, 0, sizeof key); /* the key is compared with memcmp: no stray padding bytes */
    key.ta = ta; key.tb = tb; key.m = m; key.n = n; key.k = k;
    key.lda = lda; key.ldb = ldb; key.ldd = ldd; key.batch = batch; key.bias = bias != NULL; key.bf16 = c->bf16;
    key.d16 = d16;
    key.sa = batch > 1 ? sa : 0; key.sb = batch > 1 ? sb : 0; key.sd = batch > 1 ? sd : 0;
    const size_t es = c->bf16 ? 2 : 4, ds = d16 ? 2 : 4;
    key.align_a = batch_align(a, batch, sa, es); key.align_b = batch_align(b, batch, sb, es);
    key.align_d = batch_align(D, batch, sd, ds);
    key.align_bias = !bias ? 0 : pb ? ptr_align(pb) : 1; /* 1: the bias kernel (no bf16 copy of it) */
    if (e) {
        key.epi = e->kind;
        key.ldaux = e->ldaux;
        key.align_aux = ptr_align(e->aux);
    }
    int none;
    gemm_plan *p = plan_get(c, &key, pb, e ? e->aux : NULL, &none);
    if (e && !p) return none; /* no epilogue here: the caller's unfused path (which has the fp32 one) */
    void *d = D;
    if (!p && none && key.bf16 && c->bf16_only) return 1; /* the caller's other way (the unpadded head) */
    if (!p && none && key.bf16) { /* no bf16 algorithm for this shape: this product in fp32 instead */
        if (require_fast_path()) {
            fail(c, DT_ERR_CONFIG, "rank %d (host %s, GPU %d %s): the fast path did not run: cuBLASLt has no bf16 "
                 "algorithm for a %dx%dx%d product (trans %d%d, batch %d), which would run in fp32 "
                 "(DTRAIN_REQUIRE_FAST_PATH=1 makes a fallback an error)", c->rank, c->host, c->device, c->gpu_name,
                 m, n, k, ta, tb, batch);
            return 0;
        }
        if (!c->noted_fp32++)
            fprintf(stderr, "dtrain: note: rank %d: cuBLASLt has no bf16 algorithm for a %dx%dx%d product (trans %d%d, "
                    "batch %d) on GPU %d (%s): products without one run in fp32 (slower for them, not less exact)\n",
                    c->rank, m, n, k, ta, tb, batch, c->device, c->gpu_name);
        const size_t slot = fp32_slot_bytes() / sizeof(float);
        if ((a16 && na > slot) || (b16 && nb > slot) || (d16 && nd > slot))
            return gemm_pieces(c, ta, tb, m, n, k, A, a16, lda, B, b16, ldb, D, d16, ldd, batch, alpha, beta, bias);
        /* fp32 operands: bf16 ones widened (exactly), a bf16 D through an fp32 one */
        a = a16 ? widened(c, SCR_A32, A, na) : A;
        b = b16 ? widened(c, SCR_B32, B, nb) : B;
        /* a bf16 D the product adds onto (beta): widened first, its m columns cast back after */
        d = !d16         ? D
            : beta != 0.0f ? (void *)widened(c, SCR_D32, D, nd)
                           : scratch(c, SCR_D32, nd * sizeof(float), "fp32 matmul operands");
        if (!a || !b || !d) return 0;
        key.bf16 = key.d16 = 0;
        pb = bias;
        key.align_a = batch_align(a, batch, sa, 4);
        key.align_b = batch_align(b, batch, sb, 4);
        key.align_d = batch_align(d, batch, sd, 4);
        key.align_bias = bias ? ptr_align(bias) : 0;
        p = plan_get(c, &key, bias, NULL, &none);
    }
    if (!p) {
        if (none)
            fail(c, DT_ERR_DEVICE, "cuBLASLt has no algorithm for an fp32 product %dx%dx%d (trans %d%d, batch %d) on "
                 "rank %d (host %s, GPU %d %s)", m, n, k, ta, tb, batch, c->rank, c->host, c->device, c->gpu_name);
        return 0;
    }
    if (pb && !p->bias_kernel &&
        CKLT(lt.cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pb, sizeof pb)))
        return 0;
    if (e && CKLT(lt.cublasLtMatmulDescSetAttribute(p->op, e->kind == EPI_BGRADA ? CUBLASLT_MATMUL_DESC_BIAS_POINTER
                                                                              : CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                     &e->aux, sizeof e->aux)))
        return 0;
    /* the bias kernel (n rows of m): after an fp32 product; under a bf16 one, first, as the rows
     * the product adds onto with beta 1 (rounded once, as the epilogue's sum: a bf16 product
     * rounded before the bias is added can lose all of a result the bias cancels) */
    const int bias_kernel = bias && (p->bias_kernel || !pb);
    if (bias_kernel && key.d16) {
        if (CK(dtk_add_bias(c->s, DTK_BF16, d, bias, n, m, 0))) return 0;
        beta = 1.0f;
    }
    if (CKLT(lt.cublasLtMatmul(c->lt, p->op, &alpha, a, p->la, b, p->lb, &beta, d, p->ld, d, p->ld, &p->algo, c->lt_ws,
                               LT_WORKSPACE, c->s)))
        return 0;
    if (bias_kernel && !key.d16 && CK(dtk_add_bias(c->s, DTK_F32, d, bias, n, m, 1))) return 0;
    /* D's m columns of each row, not those past m (a padded output's); the batches' rows follow
     * one another (attention's are dense), so they are n * batch rows ldd apart */
    if (d != D && batch > 1 && sd != (long long)ldd * n)
        fail(c, DT_ERR_INTERNAL, "gemm: a bf16 output in batches %lld apart, not %lld (rows of %d)", sd,
             (long long)ldd * n, ldd);
    else if (d != D)
        CK(dtk_cast_bf16_rows(c->s, D, d, (size_t)n * (size_t)batch, m, ldd));
    return 0;
}

/* the element of this backend's activations: bf16 with bf16 products */
#define ACT(c) ((c)->bf16 ? DTK_BF16 : DTK_F32)

/* A product with the padded head h (bf16, lda K) as A, in bf16 only: 0 when queued (or failed),
 * 1 when cuBLASLt has no bf16 algorithm for it (the caller runs the unpadded product, whose
 * fp32 fallback reads the master weights) */
static int padded_gemm(cuda_ctx *c, int ta, int m, int n, int k, const dtk_bf16 *h, const dt_act *b, int ldb, dt_act *d) {
    c->bf16_only = 1;
    const int r = gemm(c, ta, 0, m, n, k, h, 1, c->head_in, 0, b, 1, ldb, 0, d, 1, ta ? m : c->head_in, 0, 1, 1.0f,
                       0.0f, NULL, NULL);
    c->bf16_only = 0;
    return r;
}

/* Row-major out(M,N) = inp(M,K) @ W + bias; in column-major terms out^T = op(W) inp^T. out's
 * rows ldo apart: the logits' padded stride (logits_stride), which keeps every row 16-byte
 * aligned for cuBLASLt and the kernels (50257 bf16 would leave them 2-byte aligned). */
static void cu_matmul_fwd(void *ctx, dt_act *out, const dt_act *inp, const float *w, const float *bias, int M, int K,
                          int N, int ldo, int w_trans) {
    cuda_ctx *c = ctx;
    const int a16 = c->bf16;
    if (bias && ldo != N) { /* the bias kernel adds to dense rows */
        fail(c, DT_ERR_INTERNAL, "matmul_fwd: a bias with rows %d apart for %d columns", ldo, N);
        return;
    }
    /* W (K,N) row-major is N x K column-major (no transpose); W (N,K) is K x N (transpose) */
    const dtk_bf16 *h = a16 && w_trans && !bias ? head_padded(c, w, N, K, ldo) : NULL;
    c->head_zeros = h && !padded_gemm(c, 1, ldo, M, K, h, inp, K, out); /* the head at its padded width */
    if (!c->head_zeros && c->err == DT_OK)
        gemm(c, w_trans, 0, N, M, K, w, 0, w_trans ? K : N, 0, inp, a16, K, 0, out, a16, ldo, 0, 1, 1.0f, 0.0f, bias,
             NULL);
}

/* matmul_bwd's dw += and dbias += (dout's rows ldo apart) */
static void matmul_bwd_weights(cuda_ctx *c, float *dw, float *dbias, const dt_act *dout, const dt_act *inp, int M, int K,
                               int N, int ldo, int w_trans) {
    const int a16 = c->bf16;
    if (dw && w_trans) { /* dW(N,K) += dout^T inp: dW^T (K x N) = inp^T (K x M) (dout^T)^T (M x N) */
        /* the padded head's rows: the multiple of 128 first (its Hopper kernels; all 50257 of
         * GPT-2's took cuBLASLt's generic one, 2.5 ms on the H200), then the rest */
        const int n1 = a16 && c->head16 && N == c->head_rows && K == c->head_in && ldo == c->head_pad ? N / 128 * 128 : 0;
        if (n1 > 0 && c->err == DT_OK)
            gemm(c, 0, 1, K, n1, M, inp, a16, K, 0, dout, a16, ldo, 0, dw, 0, K, 0, 1, 1.0f, 1.0f, NULL, NULL);
        if (n1 < N && c->err == DT_OK)
            gemm(c, 0, 1, K, N - n1, M, inp, a16, K, 0, (const char *)dout + (size_t)n1 * (a16 ? 2 : 4), a16, ldo, 0,
                 dw + (size_t)n1 * K, 0, K, 0, 1, 1.0f, 1.0f, NULL, NULL);
    } else if (dw) { /* dW(K,N) += inp^T dout: dW^T (N x K) = dout^T (N x M) inp (M x K) */
        /* with a bias: its gradient, the sums of dout^T's rows, in the same product (BGRADA) into
         * scratch, then added (cuBLASLt overwrites it, gradient accumulation needs +=) */
        float *bg = dbias ? scratch(c, SCR_WORK, (size_t)N * sizeof(float), "kernel scratch") : NULL;
        const gemm_epi e = {EPI_BGRADA, bg, 0};
        if (dbias && !bg) return;
        if (gemm(c, 0, 1, N, K, M, dout, a16, ldo, 0, inp, a16, K, 0, dw, 0, N, 0, 1, 1.0f, 1.0f, NULL, bg ? &e : NULL))
            gemm(c, 0, 1, N, K, M, dout, a16, ldo, 0, inp, a16, K, 0, dw, 0, N, 0, 1, 1.0f, 1.0f, NULL, NULL);
        else if (bg) { /* the epilogue ran */
            if (c->err == DT_OK) CK(dtk_add(c->s, DTK_F32, dbias, dbias, bg, (size_t)N));
            return;
        }
    }
    if (dbias && c->err == DT_OK) { /* no product to fuse it with, or no epilogue: our column sums */
        size_t wb = dtk_bias_bwd_work_bytes(M, N);
        void *work = scratch(c, SCR_WORK, wb, "kernel scratch");
        unsigned *flags = work ? col_flags(c, N) : NULL;
        if (flags) CK(dtk_bias_bwd(c->s, ACT(c), dbias, dout, M, N, work, wb, flags));
    }
}

static void cu_matmul_bwd(void *ctx, dt_act *dinp, float *dw, float *dbias, const dt_act *dout, const dt_act *inp,
                          const float *w, int M, int K, int N, int ldo, int w_trans) {
    cuda_ctx *c = ctx;
    const int a16 = c->bf16;
    if (dbias && ldo != N) { /* the column sums read dense rows */
        fail(c, DT_ERR_INTERNAL, "matmul_bwd: a bias gradient with rows %d apart for %d columns", ldo, N);
        return;
    }
    /* dinp(M,K) = dout @ W^T: dinp^T (K x M) = op(W) (K x N) dout^T (N x M); the head over its
     * padded width, after a padded forward (dout's padding columns, its zeros, finite: times the
     * zero rows, nothing) */
    const dtk_bf16 *h = dinp && a16 && w_trans && c->head_zeros ? head_padded(c, w, N, K, ldo) : NULL;
    const int padded = h && !padded_gemm(c, 0, K, M, ldo, h, dout, ldo, dinp);
    if (!padded && dinp && c->err == DT_OK)
        gemm(c, !w_trans, 0, K, M, N, w, 0, w_trans ? K : N, 0, dout, a16, ldo, 0, dinp, a16, K, 0, 1, 1.0f, 0.0f, NULL,
             NULL);
    matmul_bwd_weights(c, dw, dbias, dout, inp, M, K, N, ldo, w_trans);
}

/* The products of a frozen bf16 weight (ops.h matmul16_fwd, matmul16_bwd: model.lora.base_dtype
 * bf16): the weight is cuBLASLt's bf16 operand as it is (no working copy, no padded head: the
 * logits' padding columns are left as they are and never read). The model asks for them only
 * with bf16 products. */
static int base16_ok(cuda_ctx *c, const char *op) {
    if (c->bf16) return 1;
    fail(c, DT_ERR_INTERNAL, "%s: a bf16 weight with fp32 products (model.lora.base_dtype bf16 needs bf16 ones)", op);
    return 0;
}

/* The product of a bf16 weight in bf16 (gemm with bf16_only); 1 when cuBLASLt has no bf16
 * algorithm for it, having queued nothing */
static int gemm16(cuda_ctx *c, int ta, int m, int n, int k, const uint16_t *w, int lda, const dt_act *b, int ldb,
                  dt_act *d, int ldd, float beta, const float *bias) {
    c->bf16_only = 1;
    const int none = gemm(c, ta, 0, m, n, k, w, 1, lda, 0, b, 1, ldb, 0, d, 1, ldd, 0, 1, 1.0f, beta, bias, NULL);
    c->bf16_only = 0;
    return none;
}

/* Without a bf16 algorithm the product runs in fp32 on a widened copy of the weight, which a
 * slot (fp32_slot_bytes) holds only up to a size: larger weights go in pieces of whole rows of
 * their storage, each piece's rows contiguous. With ta (stored k x m, column-major), pieces of
 * op(W)'s rows: D's rows i.. (bias: added first, on dense rows); else pieces of op(W)'s columns,
 * B's rows j.., each adding onto an fp32 copy of D (beta 1 after the first), rounded at the end. */
static void gemm16_pieces(cuda_ctx *c, int ta, int m, int n, int k, const uint16_t *w, int lda, const dt_act *b,
                          int ldb, dt_act *d, int ldd, const float *bias) {
    const size_t es = sizeof(dtk_bf16), slot = fp32_slot_bytes() / sizeof(float);
    const int step = (int)(slot / (size_t)lda < (size_t)(ta ? m : k) ? slot / (size_t)lda : (size_t)(ta ? m : k));
    if (step < 1) {
        fail(c, DT_ERR_INTERNAL, "matmul16: a bf16 weight of %d-element rows cannot be widened in slots of %zu bytes", lda,
             fp32_slot_bytes());
        return;
    }
    if (ta) {
        if (bias && CK(dtk_add_bias(c->s, DTK_BF16, d, bias, n, m, 0))) return; /* D = bias, dense (ldd == m) */
        for (int i = 0; i < m && c->err == DT_OK; i += step)
            gemm(c, 1, 0, m - i < step ? m - i : step, n, k, w + (size_t)i * lda, 1, lda, 0, b, 1, ldb, 0,
                 (char *)d + (size_t)i * es, 1, ldd, 0, 1, 1.0f, bias ? 1.0f : 0.0f, NULL, NULL);
        return;
    }
    /* the pieces summed in an fp32 D (SCR_D32: gemm uses it only for a bf16 D), rounded once */
    float *acc = scratch(c, SCR_D32, ((size_t)ldd * (size_t)(n - 1) + (size_t)m) * sizeof(float), "fp32 matmul operands");
    for (int j = 0; acc && j < k && c->err == DT_OK; j += step)
        gemm(c, 0, 0, m, n, k - j < step ? k - j : step, w + (size_t)j * lda, 1, lda, 0, (const char *)b + (size_t)j * es,
             1, ldb, 0, acc, 0, ldd, 0, 1, 1.0f, j ? 1.0f : 0.0f, j ? NULL : bias, NULL);
    if (acc && c->err == DT_OK) CK(dtk_cast_bf16_rows(c->s, (dtk_bf16 *)d, acc, (size_t)n, (size_t)m, (size_t)ldd));
}

static void cu_matmul16_fwd(void *ctx, dt_act *out, const dt_act *inp, const uint16_t *w, const float *bias, int M,
                            int K, int N, int ldo, int w_trans) {
    cuda_ctx *c = ctx;
    if (!base16_ok(c, "matmul16_fwd")) return;
    if (bias && ldo != N) { /* the bias kernel adds to dense rows */
        fail(c, DT_ERR_INTERNAL, "matmul16_fwd: a bias with rows %d apart for %d columns", ldo, N);
        return;
    }
    /* the frozen head at its padded width (its zero rows follow it: the logits' padding columns
     * become zeros, as the padded copy's do) */
    c->head_zeros = w_trans && !bias && N == c->base_head_rows && K == c->base_head_in && ldo == c->base_head_pad &&
                    ldo > N && !gemm16(c, 1, ldo, M, K, w, K, inp, K, out, ldo, 0.0f, NULL);
    if (c->head_zeros || c->err != DT_OK) return;
    /* out^T (N x M) = op(W) (N x K) inp^T (K x M) */
    if (gemm16(c, w_trans, N, M, K, w, w_trans ? K : N, inp, K, out, ldo, 0.0f, bias))
        gemm16_pieces(c, w_trans, N, M, K, w, w_trans ? K : N, inp, K, out, ldo, bias);
}

static void cu_matmul16_bwd(void *ctx, dt_act *dinp, const dt_act *dout, const uint16_t *w, int M, int K, int N, int ldo,
                            int w_trans) {
    cuda_ctx *c = ctx;
    if (!base16_ok(c, "matmul16_bwd") || !dinp) return;
    /* after a padded forward, the head over its padded width too (dout's padding columns, the
     * forward's zeros, finite: times the zero rows, nothing) */
    if (c->head_zeros && w_trans && N == c->base_head_rows && K == c->base_head_in && ldo == c->base_head_pad &&
        (!gemm16(c, 0, K, M, ldo, w, K, dout, ldo, dinp, K, 0.0f, NULL) || c->err != DT_OK))
        return;
    /* dinp^T (K x M) = op(W) (K x N) dout^T (N x M), dout's N columns of rows ldo apart */
    if (gemm16(c, !w_trans, K, M, N, w, w_trans ? K : N, dout, ldo, dinp, K, 0.0f, NULL))
        gemm16_pieces(c, !w_trans, K, M, N, w, w_trans ? K : N, dout, ldo, dinp, K, NULL);
}

/* LoRA (ops.h lora_fwd, lora_bwd): thin products through gemm, h and dh in fp32 (bf16 products
 * read them rounded, as any fp32 operand); out's and dinp's columns added onto (beta 1). In
 * column-major terms a row-major X(M,K) is K x M with ld K, A (r,K) is K x r, B (N,r) r x N. */
static void cu_lora_fwd(void *ctx, dt_act *out, float *h, const dt_act *inp, const float *A, const float *B, int M, int K,
                        int N, int r, int ldo, float s) {
    cuda_ctx *c = ctx;
    const int a16 = c->bf16;
    /* h^T (r x M) = op(A) (r x K) inp^T (K x M) */
    gemm(c, 1, 0, r, M, K, A, 0, K, 0, inp, a16, K, 0, h, 0, r, 0, 1, 1.0f, 0.0f, NULL, NULL);
    /* out^T (N x M) += s op(B) (N x r) h^T (r x M) */
    gemm(c, 1, 0, N, M, r, B, 0, r, 0, h, 0, r, 0, out, a16, ldo, 0, 1, s, 1.0f, NULL, NULL);
}

static void cu_lora_bwd(void *ctx, dt_act *dinp, float *dA, float *dB, const float *h, float *dh, const dt_act *dout,
                        const dt_act *inp, const float *A, const float *B, int M, int K, int N, int r, int ldo, float s) {
    cuda_ctx *c = ctx;
    const int a16 = c->bf16;
    /* dh^T (r x M) = s B^T (r x N) dout^T (N x M) (dout NULL: given) */
    if (dout) gemm(c, 0, 0, r, M, N, B, 0, r, 0, dout, a16, ldo, 0, dh, 0, r, 0, 1, s, 0.0f, NULL, NULL);
    /* dB^T (r x N) += s h^T (r x M) dout (M x N) */
    if (dout && dB) gemm(c, 0, 1, r, N, M, h, 0, r, 0, dout, a16, ldo, 0, dB, 0, r, 0, 1, s, 1.0f, NULL, NULL);
    /* dA^T (K x r) += inp^T (K x M) dh (M x r) */
    if (dA) gemm(c, 0, 1, K, r, M, inp, a16, K, 0, dh, 0, r, 0, dA, 0, K, 0, 1, 1.0f, 1.0f, NULL, NULL);
    /* dinp^T (K x M) += A^T (K x r) dh^T (r x M) */
    if (dinp) gemm(c, 0, 0, K, M, r, A, 0, K, 0, dh, 0, r, 0, dinp, a16, K, 0, 1, 1.0f, 1.0f, NULL, NULL);
}

/* fused where cuBLASLt has the GELU epilogue for the shape (ops.h); else the two calls */
static void cu_gelu_fwd(void *ctx, dt_act *out, const dt_act *inp, size_t n);
static void cu_gelu_bwd(void *ctx, dt_act *dinp, const dt_act *inp, const dt_act *dout, size_t n);

static void cu_matmul_gelu_fwd(void *ctx, dt_act *out, dt_act *pre, const dt_act *inp, const float *w, const float *bias,
                               int M, int K, int N) {
    cuda_ctx *c = ctx;
    const gemm_epi e = {EPI_GELU, pre, N};
    if (!gemm(c, 0, 0, N, M, K, w, 0, N, 0, inp, c->bf16, K, 0, out, c->bf16, N, 0, 1, 1.0f, 0.0f, bias, &e)) return;
    cu_matmul_fwd(ctx, pre, inp, w, bias, M, K, N, N, 0);
    cu_gelu_fwd(ctx, out, pre, (size_t)M * N);
}

static void cu_matmul_gelu_bwd(void *ctx, dt_act *dinp, dt_act *tmp, float *dw, float *dbias, const dt_act *dout,
                               const dt_act *inp, const float *w, const dt_act *pre, int M, int K, int N) {
    cuda_ctx *c = ctx;
    const gemm_epi e = {EPI_DGELU, (void *)pre, K};
    /* dinp^T (K x M) = W (K x N) dout^T (N x M), times gelu'(pre) in the epilogue */
    if (gemm(c, 1, 0, K, M, N, w, 0, N, 0, dout, c->bf16, N, 0, dinp, c->bf16, K, 0, 1, 1.0f, 0.0f, NULL, &e)) {
        cu_matmul_bwd(ctx, tmp, NULL, NULL, dout, inp, w, M, K, N, N, 0);
        cu_gelu_bwd(ctx, dinp, pre, tmp, (size_t)M * K);
    }
    matmul_bwd_weights(c, dw, dbias, dout, inp, M, K, N, N, 0);
}

/* ---- attention ----
 * With bf16 products (and so bf16 activations): cuDNN's fused SDPA (flash attention,
 * cudnn_att.h), reading q, k, v from the qkv activation and writing out and dqkv in place,
 * which keeps the softmax's statistics (B,NH,T) for backward instead of the probabilities;
 * grouped-query attention (NKV < NH key/value heads) is cuDNN's own; packed rows (s->pos) add a
 * mask per example (att_mask, SCR_MASK) that cuDNN adds to the scores. Where cuDNN cannot be
 * loaded or plan the shape (the frontend's head sizes: multiples of 8 up to 128, up to 256 on
 * Hopper), and with fp32 products: batched products in cuBLASLt on fp32 copies of q, k, v,
 * causal softmax in our kernels, with the T x T probabilities saved (fp32). The fallback's
 * batch is a (sequence, key/value head): the group's NH/NKV query heads are consecutive in the
 * per-head q (B,NH,T,hs), so they are one (group*T, hs) operand against that head's k and v
 * (T, hs), their scores one (group*T, T) block of the (B,NH,T,T) probabilities, and dk and dv
 * sum the group's heads inside the product; GPT-2 (NKV = NH) is group 1, the products it
 * always had. The choice is made once per geometry (T, NH, NKV, hs, packed), for the first shape asked
 * for (attention_bytes: the model's largest), and said once when cuDNN was wanted but refused. */

#define ATT_STATS_BYTES(B, T, NH) ((size_t)(B) * (size_t)(NH) * (size_t)(T) * sizeof(float))
#define ATT_PROBS_BYTES(B, T, NH) ((size_t)(B) * (size_t)(NH) * (size_t)(T) * (size_t)(T) * sizeof(float))
/* packed rows' mask for cuDNN (cudnn_att.h): (B,T,T) bf16, rows DTC_MASK_LD(T) apart, one for all heads */
#define ATT_MASK_BYTES(B, T) ((size_t)(B) * (size_t)(T) * (size_t)DTC_MASK_LD(T) * sizeof(dtk_bf16))
/* cuDNN's workspace before a device says (--dry-run): the deterministic backward's as the cuDNN
 * frontend (1.32, scaled_dot_product_flash_attention.h) routes it on Hopper, dP in 16 bits for
 * B x NH x T x T padded to 64 rows and 128 columns (the largest of its padding rules), and the
 * softmax sums, (B,NH,T) floats (NH query heads: grouped key/value heads change neither). On a
 * device the plan's own size (dtc_att_plan) is reserved. */
#define ATT_ROUND(x, r) (((size_t)(x) + (r) - 1) / (r) * (r))
#define ATT_WS_GUESS(B, T, NH) ((size_t)(B) * (size_t)(NH) * (ATT_ROUND(T, 64) * ATT_ROUND(T, 128) * 2 + \
                                                             (size_t)(T) * sizeof(float)))

/* Could cuDNN plan shape s on some GPU (the estimate's question, without a device)? The
 * frontend's head sizes: multiples of 8, up to 256 on Hopper (128 before it); NH a multiple of
 * NKV. A head size outside that never runs fused: the estimate counts our kernels' memory.
 * Packed rows (s->pos) run fused too, with a mask per example (ATT_MASK_BYTES, SCR_MASK). */
static int att_may_fuse(const dt_att_shape *s) {
    return s->T > 1 && s->hs > 0 && s->hs % 8 == 0 && s->hs <= 256 && s->NKV > 0 && s->NH % s->NKV == 0;
}

static dtc_shape dtc_of(const dt_att_shape *s) { return (dtc_shape){s->B, s->T, s->NH, s->NKV, s->hs, !!s->pos}; }
static dtk_att_shape dtk_of(const dt_att_shape *s) { return (dtk_att_shape){s->B, s->T, s->NH, s->NKV, s->hs, s->pos}; }

/* the note of an attention that cuDNN refused: once per process and rank */
static void att_note(cuda_ctx *c, const dt_att_shape *s, const char *why) {
    if (c->att_noted++) return;
    char more[32];
    human_bytes(more, sizeof more, (double)(ATT_PROBS_BYTES(s->B, s->T, s->NH) - ATT_STATS_BYTES(s->B, s->T, s->NH)));
    fprintf(stderr, "dtrain: note: rank %d: attention runs on dtrain's kernels, not cuDNN's fused attention (%s): "
            "slower, and its T x T probabilities take %s more memory per layer\n", c->rank, why, more);
}

/* 1 when attention of geometry (T, NH, NKV, hs) runs through cuDNN: decided on its first call,
 * by planning batch s->B (forward and backward; the forward only for inference), and kept for
 * every batch size. */
static int att_fused(cuda_ctx *c, const dt_att_shape *s) {
    for (int i = 0; i < c->n_att_geo; i++) {
        const dt_att_shape *g = &c->att_geo[i].s;
        if (g->T == s->T && g->NH == s->NH && g->NKV == s->NKV && g->hs == s->hs && !g->pos == !s->pos)
            return c->att_geo[i].fused;
    }
    char why[640] = "";
    const char *env = getenv("DTRAIN_CUDNN_ATTENTION");
    size_t ws = 0;
    int fused = 0;
    if (!c->bf16) {
        /* cuDNN's fused attention is bf16 (or fp16) only: fp32 products asked for fp32 */
    } else if (env && strcmp(env, "0") == 0) {
        snprintf(why, sizeof why, "DTRAIN_CUDNN_ATTENTION=0");
    } else {
        if (!c->att) c->att = dtc_att_open(c->s, why, sizeof why);
        fused = c->att && dtc_att_plan(c->att, dtc_of(s), !c->inference, &ws, why, sizeof why) == 0;
    }
    if (fused && log_plans()) /* the workspace the estimate could only assume */
        fprintf(stderr, "dtrain: rank %d: cuDNN attention plan: B %d T %d NH %d NKV %d HS %d, %s: workspace %zu bytes "
                "(--dry-run assumes %zu for training)\n", c->rank, s->B, s->T, s->NH, s->NKV, s->hs,
                c->inference ? "forward only" : "forward and backward", ws, ATT_WS_GUESS(s->B, s->T, s->NH));
    if (fused && !scratch(c, SCR_CUDNN, ws, "the cuDNN attention workspace")) return 0;
    if (fused && s->pos && !scratch(c, SCR_MASK, ATT_MASK_BYTES(s->B, s->T), "the packed rows' attention mask"))
        return 0;
    if (why[0] && !fused && require_fast_path() && att_may_fuse(s) && s->hs <= 128) /* cuDNN's sizes on every GPU */
        fail(c, DT_ERR_CONFIG, "rank %d (host %s, GPU %d %s): the fast path did not run: attention of head size %d "
             "would run on dtrain's kernels, not cuDNN's fused attention (%s) (DTRAIN_REQUIRE_FAST_PATH=1 makes a "
             "fallback an error)", c->rank, c->host, c->device, c->gpu_name, s->hs, why);
    else if (why[0] && !fused) att_note(c, s, why);
    const int i = c->n_att_geo < 8 ? c->n_att_geo++ : 7; /* more geometries than a model has: reuse the last */
    c->att_geo[i].s = *s;
    c->att_geo[i].fused = fused;
    return fused;
}

static int cu_attention_bytes(void *ctx, const dt_att_shape *s, int bf16, size_t *att, size_t *datt) {
    cuda_ctx *c = ctx;
    const int fused = c ? att_fused(c, s) : bf16 && att_may_fuse(s);
    *att = fused ? ATT_STATS_BYTES(s->B, s->T, s->NH) : ATT_PROBS_BYTES(s->B, s->T, s->NH);
    *datt = fused ? 0 : ATT_PROBS_BYTES(s->B, s->T, s->NH);
    return !fused;
}

/* cuDNN's workspace for this shape, for the forward or with `backward` for both directions
 * (planned when new); NULL after a failure */
static void *att_workspace(cuda_ctx *c, const dt_att_shape *s, int backward, size_t *ws) {
    char why[640];
    if (dtc_att_plan(c->att, dtc_of(s), backward, ws, why, sizeof why) != 0) {
        fail(c, DT_ERR_DEVICE, "cuDNN attention on rank %d (host %s, GPU %d): %s (hint: DTRAIN_CUDNN_ATTENTION=0 "
             "runs dtrain's kernels instead)", c->rank, c->host, c->device, why);
        return NULL;
    }
    return scratch(c, SCR_CUDNN, *ws, "the cuDNN attention workspace");
}

static void att_failed(cuda_ctx *c, const char *what, const char *why) {
    fail(c, DT_ERR_DEVICE, "cuDNN attention %s on rank %d (host %s, GPU %d): %s", what, c->rank, c->host, c->device,
         why);
}

/* packed rows' mask (cudnn_att.h), written from s->pos on the stream for this call: forward
 * and backward each write it, since another micro-batch's forward (grad accumulation, the
 * pipeline's schedule) may run between them. NULL for rows that are not packed, or after a
 * failure (c->err set). */
static void *att_mask(cuda_ctx *c, const dt_att_shape *s) {
    if (!s->pos) return NULL;
    dtk_bf16 *m = scratch(c, SCR_MASK, ATT_MASK_BYTES(s->B, s->T), "the packed rows' attention mask");
    return m && !CK(dtk_att_example_mask(c->s, m, DTC_MASK_LD(s->T), dtk_of(s))) ? m : NULL;
}

static void fused_fwd(cuda_ctx *c, void *out, float *stats, const void *qkv, const dt_att_shape *s) {
    size_t ws_bytes = 0;
    void *ws = att_workspace(c, s, 0, &ws_bytes), *mask = ws ? att_mask(c, s) : NULL;
    char why[640];
    if (ws && c->err == DT_OK &&
        dtc_att_fwd(c->att, out, stats, qkv, mask, dtc_of(s), ws, ws_bytes, why, sizeof why) != 0)
        att_failed(c, "forward", why);
}

static void fused_bwd(cuda_ctx *c, void *dqkv, const void *dout, const void *qkv, const void *out, const float *stats,
                      const dt_att_shape *s) {
    size_t ws_bytes = 0;
    void *ws = att_workspace(c, s, 1, &ws_bytes), *mask = ws ? att_mask(c, s) : NULL;
    char why[640];
    if (ws && c->err == DT_OK &&
        dtc_att_bwd(c->att, dqkv, dout, qkv, mask, out, stats, dtc_of(s), ws, ws_bytes, why, sizeof why) != 0)
        att_failed(c, "backward", why);
}

/* The fallback's per-head operands in column-major terms, one product per (sequence, key/value
 * head): a query block is hs x gT (the group's G = NH/NKV heads, gT = G*T columns), a key or
 * value block hs x T, a score block T x gT (ld T); sq, sk, sp are their batch strides. */
typedef struct att_blocks {
    int T, hs, gT, batch;
    long long sq, sk, sp;
} att_blocks;

static att_blocks att_blocks_of(const dt_att_shape *s) {
    const int G = s->NH / s->NKV;
    return (att_blocks){s->T, s->hs, G * s->T, s->B * s->NKV, (long long)G * s->T * s->hs, (long long)s->T * s->hs,
                        (long long)G * s->T * s->T};
}

/* floats of the per-head q (or y, dy, dq: NH heads) and k (or v, dk, dv: NKV heads) */
static size_t att_q_elems(const dt_att_shape *s) { return (size_t)s->B * s->T * s->NH * s->hs; }
static size_t att_kv_elems(const dt_att_shape *s) { return (size_t)s->B * s->T * s->NKV * s->hs; }

static void cu_attention_fwd(void *ctx, dt_act *out, void *att_, const dt_act *qkv, const dt_att_shape *s) {
    float *att = att_;
    cuda_ctx *c = ctx;
    if (c->err != DT_OK) return;
    if (att_fused(c, s)) {
        fused_fwd(c, out, att, qkv, s);
        return;
    }
    const dtk_type at = ACT(c);
    const att_blocks a = att_blocks_of(s);
    const size_t nq = att_q_elems(s), nkv = att_kv_elems(s);
    float *q = scratch(c, SCR_ATT, (2 * nq + 2 * nkv) * sizeof(float), "attention scratch");
    if (!q) return;
    float *k = q + nq, *v = k + nkv, *y = v + nkv;
    if (CK(dtk_qkv_split(c->s, at, q, k, v, qkv, dtk_of(s)))) return;
    /* preatt = q k^T per group: preatt^T (T x gT) = op(k_cm)=T (T x hs) q_cm (hs x gT) */
    gemm(c, 1, 0, a.T, a.gT, a.hs, k, 0, a.hs, a.sk, q, 0, a.hs, a.sq, att, 0, a.T, a.sp, a.batch, 1.0f, 0.0f, NULL, NULL);
    if (c->err != DT_OK || CK(dtk_causal_softmax_fwd(c->s, att, dtk_of(s), 1.0f / sqrtf((float)a.hs)))) return;
    /* y = P v: y^T (hs x gT) = v^T (hs x T) P^T (T x gT) */
    gemm(c, 0, 0, a.hs, a.gT, a.T, v, 0, a.hs, a.sk, att, 0, a.T, a.sp, y, 0, a.hs, a.sq, a.batch, 1.0f, 0.0f, NULL, NULL);
    if (c->err == DT_OK) CK(dtk_heads_merge(c->s, at, out, y, dtk_of(s)));
}

static void cu_attention_bwd(void *ctx, dt_act *dqkv, void *datt_, const dt_act *dout, const dt_act *qkv,
                             const dt_act *out, const void *att_, const dt_att_shape *s) {
    float *datt = datt_;
    const float *att = att_;
    cuda_ctx *c = ctx;
    if (c->err != DT_OK) return;
    if (att_fused(c, s)) {
        fused_bwd(c, dqkv, dout, qkv, out, att, s);
        return;
    }
    const dtk_type at = ACT(c);
    const att_blocks a = att_blocks_of(s);
    const size_t nq = att_q_elems(s), nkv = att_kv_elems(s);
    float *q = scratch(c, SCR_ATT, (3 * nq + 4 * nkv) * sizeof(float), "attention scratch");
    if (!q) return;
    float *k = q + nq, *v = k + nkv, *dy = v + nkv, *dq = dy + nq, *dk = dq + nq, *dv = dk + nkv;
    if (CK(dtk_qkv_split(c->s, at, q, k, v, qkv, dtk_of(s))) || CK(dtk_heads_split(c->s, at, dy, dout, dtk_of(s))))
        return;
    /* dP = dy v^T: dP^T (T x gT) = op(v_cm)=T (T x hs) dy_cm (hs x gT) */
    gemm(c, 1, 0, a.T, a.gT, a.hs, v, 0, a.hs, a.sk, dy, 0, a.hs, a.sq, datt, 0, a.T, a.sp, a.batch, 1.0f, 0.0f, NULL, NULL);
    /* dv = P^T dy, the group's heads summed: dv^T (hs x T) = dy_cm (hs x gT) op(P_cm)=T (gT x T) */
    gemm(c, 0, 1, a.hs, a.T, a.gT, dy, 0, a.hs, a.sq, att, 0, a.T, a.sp, dv, 0, a.hs, a.sk, a.batch, 1.0f, 0.0f, NULL, NULL);
    if (c->err != DT_OK || CK(dtk_causal_softmax_bwd(c->s, datt, att, dtk_of(s), 1.0f / sqrtf((float)a.hs))))
        return;
    /* datt now holds dpreatt. dq = dpre k: dq^T (hs x gT) = k_cm (hs x T) dpre_cm (T x gT) */
    gemm(c, 0, 0, a.hs, a.gT, a.T, k, 0, a.hs, a.sk, datt, 0, a.T, a.sp, dq, 0, a.hs, a.sq, a.batch, 1.0f, 0.0f, NULL, NULL);
    /* dk = dpre^T q, summed likewise: dk^T (hs x T) = q_cm (hs x gT) op(dpre_cm)=T (gT x T) */
    gemm(c, 0, 1, a.hs, a.T, a.gT, q, 0, a.hs, a.sq, datt, 0, a.T, a.sp, dk, 0, a.hs, a.sk, a.batch, 1.0f, 0.0f, NULL, NULL);
    if (c->err == DT_OK) CK(dtk_qkv_merge(c->s, at, dqkv, dq, dk, dv, dtk_of(s)));
}

static void cu_attention_cached(void *ctx, dt_act *out, dt_act *kcache, dt_act *vcache, float *scratch,
                                const dt_act *qkv, int pos0, const dt_att_shape *s) {
    cuda_ctx *c = ctx;
    if (c->err == DT_OK) CK(dtk_attention_cached(c->s, ACT(c), out, kcache, vcache, scratch, qkv, pos0, dtk_of(s)));
}

/* ---- everything else: our kernels, on activations of the element ACT(c) ---- */

#define LAUNCH(call)                                       \
    do {                                                   \
        if (c->err == DT_OK) CK(call);                     \
    } while (0)

static void cu_encoder_fwd(void *ctx, dt_act *out, const int *tokens, const int *pos, const float *wte,
                           const float *wpe, int B, int T, int C) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_encoder_fwd(c->s, ACT(c), out, tokens, pos, wte, wpe, B, T, C));
}

static void cu_encoder16_fwd(void *ctx, dt_act *out, const int *tokens, const int *pos, const uint16_t *wte,
                             const uint16_t *wpe, int v0, int V, int B, int T, int C) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_encoder16_fwd(c->s, ACT(c), out, tokens, pos, (const dtk_bf16 *)wte, (const dtk_bf16 *)wpe, v0, V, B, T,
                             C));
}

static void cu_encoder_bwd(void *ctx, float *dwte, float *dwpe, const dt_act *dout, const int *tokens, const int *pos,
                           int B, int T, int C) {
    cuda_ctx *c = ctx;
    size_t wb = dtk_encoder_bwd_work_bytes(B, T, C);
    void *work = scratch(c, SCR_WORK, wb, "kernel scratch");
    if (work) LAUNCH(dtk_encoder_bwd(c->s, ACT(c), dwte, dwpe, dout, tokens, pos, B, T, C, c->enc_vocab, work, wb));
}

static void cu_encoder_part_fwd(void *ctx, dt_act *out, const int *tokens, const int *pos, const float *wte,
                                const float *wpe, int v0, int V, int B, int T, int C) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_encoder_part_fwd(c->s, ACT(c), out, tokens, pos, wte, wpe, v0, V, B, T, C));
}

static void cu_encoder_part_bwd(void *ctx, float *dwte, float *dwpe, const dt_act *dout, const int *tokens,
                                const int *pos, int v0, int V, int B, int T, int C) {
    cuda_ctx *c = ctx;
    size_t wb = dtk_encoder_bwd_work_bytes(B, T, C);
    void *work = scratch(c, SCR_WORK, wb, "kernel scratch");
    if (work) LAUNCH(dtk_encoder_part_bwd(c->s, ACT(c), dwte, dwpe, dout, tokens, pos, v0, V, B, T, C, work, wb));
}

static void cu_layernorm_fwd(void *ctx, dt_act *out, float *mean, float *rstd, const dt_act *inp, const float *w,
                             const float *b, int N, int C) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_layernorm_fwd(c->s, ACT(c), out, mean, rstd, inp, w, b, N, C));
}

static void cu_layernorm_bwd(void *ctx, dt_act *dinp, float *dw, float *db, const dt_act *dout, const dt_act *inp,
                             const float *w, const float *mean, const float *rstd, int N, int C) {
    cuda_ctx *c = ctx;
    size_t wb = dtk_layernorm_bwd_work_bytes(N, C);
    void *work = scratch(c, SCR_WORK, wb, "kernel scratch");
    unsigned *flags = work ? col_flags(c, C) : NULL;
    if (flags) LAUNCH(dtk_layernorm_bwd(c->s, ACT(c), dinp, dw, db, dout, inp, w, mean, rstd, N, C, work, wb, flags));
}

static void cu_rmsnorm_fwd(void *ctx, dt_act *out, float *rstd, const dt_act *inp, const float *w, int N, int C,
                           float eps) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_rmsnorm_fwd(c->s, ACT(c), out, rstd, inp, w, N, C, eps));
}

static void cu_rmsnorm_bwd(void *ctx, dt_act *dinp, float *dw, const dt_act *dout, const dt_act *inp, const float *w,
                           const float *rstd, int N, int C) {
    cuda_ctx *c = ctx;
    size_t wb = dtk_rmsnorm_bwd_work_bytes(N, C);
    void *work = scratch(c, SCR_WORK, wb, "kernel scratch");
    unsigned *flags = work ? col_flags(c, C) : NULL;
    if (flags) LAUNCH(dtk_rmsnorm_bwd(c->s, ACT(c), dinp, dw, dout, inp, w, rstd, N, C, work, wb, flags));
}

static void cu_rope_fwd(void *ctx, dt_act *qkv, const float *inv_freq, int pos0, const dt_att_shape *s) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_rope(c->s, ACT(c), qkv, inv_freq, pos0, dtk_of(s), 1.0f));
}

static void cu_rope_bwd(void *ctx, dt_act *dqkv, const float *inv_freq, int pos0, const dt_att_shape *s) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_rope(c->s, ACT(c), dqkv, inv_freq, pos0, dtk_of(s), -1.0f));
}

static void cu_swiglu_fwd(void *ctx, dt_act *out, const dt_act *inp, int N, int F) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_swiglu_fwd(c->s, ACT(c), out, inp, N, F));
}

static void cu_swiglu_bwd(void *ctx, dt_act *dinp, const dt_act *inp, const dt_act *dout, int N, int F) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_swiglu_bwd(c->s, ACT(c), dinp, inp, dout, N, F));
}

static void cu_gelu_fwd(void *ctx, dt_act *out, const dt_act *inp, size_t n) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_gelu_fwd(c->s, ACT(c), out, inp, n));
}

static void cu_gelu_bwd(void *ctx, dt_act *dinp, const dt_act *inp, const dt_act *dout, size_t n) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_gelu_bwd(c->s, ACT(c), dinp, inp, dout, n));
}

static void cu_add(void *ctx, dt_act *out, const dt_act *a, const dt_act *b, size_t n) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_add(c->s, ACT(c), out, a, b, n));
}

static void cu_xent_fwd(void *ctx, float *losses, dt_act *probs, const dt_act *logits, const int *targets, int N, int V,
                        int ld) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_xent_fwd(c->s, ACT(c), losses, probs, logits, targets, N, V, ld));
}

static void cu_xent_bwd(void *ctx, dt_act *dlogits, const dt_act *probs, const int *targets, float scale, int N, int V,
                        int ld) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_xent_bwd(c->s, ACT(c), dlogits, probs, targets, scale, N, V, ld));
}

static void cu_xent_fused(void *ctx, float *losses, dt_act *dlogits, const dt_act *logits, const int *targets,
                          float scale, int N, int V, int ld) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_xent_fused(c->s, ACT(c), losses, dlogits, logits, targets, scale, N, V, ld));
}

static void cu_xent_part_stats(void *ctx, float *stats, const dt_act *logits, const int *targets, int v0, int N, int V,
                               int ld) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_xent_part_stats(c->s, ACT(c), stats, logits, targets, v0, N, V, ld));
}

static void cu_xent_part_bwd(void *ctx, dt_act *dlogits, const dt_act *logits, const float *lse, const int *targets,
                             int v0, float scale, int N, int V, int ld) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_xent_part_bwd(c->s, ACT(c), dlogits, logits, lse, targets, v0, scale, N, V, ld));
}

static void cu_argmax(void *ctx, int *idx, const dt_act *x, int N, int V, int ld) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_argmax(c->s, ACT(c), idx, x, N, V, ld));
}

static void cu_gather_rows(void *ctx, dt_act *out, const dt_act *x, const int *rows, int n, int C) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_gather_rows(c->s, ACT(c), out, x, rows, n, C));
}

static void cu_scatter_add_rows(void *ctx, dt_act *dx, const dt_act *dout, const int *rows, int n, int C) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_scatter_add_rows(c->s, ACT(c), dx, dout, rows, n, C));
}

/* adamw's piece table on the device: uploaded when it differs from the last one (the optimizer
 * passes the same table every step); made at open for ADAMW_PIECES pieces (more than a model's
 * tensors), grown only past that */
static const dtk_adamw_piece *piece_table(cuda_ctx *c, const dt_adamw_piece *pieces, int n, size_t *total) {
    if (n > c->cap_pieces) {
        dtk_adamw_piece *h = realloc(c->pieces_host, (size_t)n * sizeof *h);
        if (!h) {
            fail(c, DT_ERR_NOMEM, "out of host memory for the AdamW table (%d pieces)", n);
            return NULL;
        }
        c->pieces_host = h;
        if (c->pieces_dev && CK(cudaFree(c->pieces_dev))) return NULL;
        c->pieces_dev = NULL;
        dt_status st = dev_malloc(c, (void **)&c->pieces_dev, (size_t)n * sizeof *c->pieces_dev, "the AdamW table");
        if (st != DT_OK) {
            fail(c, st, "%s", dt_error_msg());
            return NULL;
        }
        c->cap_pieces = n;
        c->n_pieces = 0; /* nothing valid on the device */
    }
    int same = n == c->n_pieces;
    size_t start = 0;
    for (int k = 0; k < n; k++) {
        dtk_adamw_piece q;
        memset(&q, 0, sizeof q); /* compared with memcmp: no stray padding bytes */
        q.start = start;
        q.offset = pieces[k].offset;
        q.moff = pieces[k].moff;
        q.decay = pieces[k].decay;
        same = same && memcmp(&c->pieces_host[k], &q, sizeof q) == 0;
        c->pieces_host[k] = q;
        start += pieces[k].numel;
    }
    *total = start;
    if (!same) { /* staged: the host table may change before the copy runs */
        stage_upload(c, c->pieces_dev, c->pieces_host, (size_t)n * sizeof *c->pieces_host);
        c->n_pieces = c->err == DT_OK ? n : 0;
    }
    return c->err == DT_OK ? c->pieces_dev : NULL;
}

static void cu_adamw(void *ctx, float *p, const float *g, float *m, float *v, const dt_adamw_piece *pieces,
                     int n_pieces, float lr, float beta1, float beta2, float eps, float weight_decay, int t) {
    cuda_ctx *c = ctx;
    if (c->err != DT_OK || n_pieces <= 0) return;
    /* the update refreshes the weights' working copy in the same pass, when every piece is in it */
    size_t lo = SIZE_MAX, hi = 0;
    for (int k = 0; k < n_pieces; k++) {
        if (pieces[k].offset < lo) lo = pieces[k].offset;
        if (pieces[k].offset + pieces[k].numel > hi) hi = pieces[k].offset + pieces[k].numel;
    }
    dtk_bf16 *p16 = NULL;
    if (c->shadow && p + lo >= c->master && p + hi <= c->master + c->n_master && !(p16 = fresh_shadow(c))) return;
    if (p16) {
        p16 += p - c->master;
        c->head16_of = NULL; /* the head's padded copy follows at its next product */
    } else if (touches_master(c, p + lo, (hi - lo) * sizeof(float))) c->shadow_stale = 1; /* updated without its copy */
    size_t total = 0;
    const dtk_adamw_piece *table = piece_table(c, pieces, n_pieces, &total);
    if (!table) return;
    LAUNCH(dtk_adamw(c->s, p, p16, g, m, v, table, n_pieces, total, lr, beta1, beta2, eps, weight_decay, t));
}

/* sumsq's and scale's table of ranges on the device: uploaded (staged) when it differs from the
 * last one (the optimizer passes the same ranges every step); *total: their elements */
static const dtk_range *range_table(cuda_ctx *c, const dt_range *ranges, int n, size_t *total) {
    _Static_assert(sizeof(dtk_range) == sizeof(dt_range), "dtk_range is dt_range's layout");
    *total = 0;
    if (c->err != DT_OK) return NULL;
    if (n > N_RANGES) {
        fail(c, DT_ERR_INTERNAL, "sumsq/scale over %d ranges: at most %d", n, N_RANGES);
        return NULL;
    }
    for (int k = 0; k < n; k++) *total += ranges[k].numel;
    if (n != c->n_ranges || memcmp(c->ranges_host, ranges, (size_t)n * sizeof *ranges) != 0) {
        memcpy(c->ranges_host, ranges, (size_t)n * sizeof *ranges);
        stage_upload(c, c->ranges_dev, c->ranges_host, (size_t)n * sizeof *c->ranges_host);
        c->n_ranges = c->err == DT_OK ? n : 0;
    }
    return c->err == DT_OK ? c->ranges_dev : NULL;
}

static void cu_sumsq(void *ctx, double *out, const float *x, const dt_range *ranges, int n_ranges) {
    cuda_ctx *c = ctx;
    size_t total;
    const dtk_range *table = range_table(c, ranges, n_ranges, &total);
    const size_t wb = dtk_sumsq_work_bytes(total);
    void *work = table && wb ? scratch(c, SCR_WORK, wb, "kernel scratch") : NULL;
    if (table && (work || !wb)) LAUNCH(dtk_sumsq(c->s, out, x, table, n_ranges, total, work, wb));
}

static void cu_scale(void *ctx, float *x, const dt_range *ranges, int n_ranges, float s) {
    cuda_ctx *c = ctx;
    size_t total;
    const dtk_range *table = range_table(c, ranges, n_ranges, &total);
    if (table) LAUNCH(dtk_scale(c->s, x, table, n_ranges, total, s));
}

static void cu_loss_sum(void *ctx, double *acc, const float *losses, const int *targets, int n) {
    cuda_ctx *c = ctx;
    LAUNCH(dtk_loss_sum(c->s, acc, losses, targets, n));
}

static dt_status cu_check(void *ctx) {
    cuda_ctx *c = ctx;
    if (c->err == DT_OK && !CK(cudaStreamSynchronize(c->s))) stage_drained(c);
    if (c->err == DT_OK) CK(cudaGetLastError());
    return c->err == DT_OK ? DT_OK : dt_error_set(c->err, "%s", c->err_msg);
}

/* ---- init / free ---- */

static void ctx_free(cuda_ctx *c) {
    if (!c) return;
    if (c->s) cudaStreamSynchronize(c->s);
    for (int i = 0; i < N_PLANS; i++) plan_release(&c->plans[i]);
    dtc_att_close(c->att);
    for (int i = 0; i < N_SCRATCH; i++) cudaFree(c->scr[i]);
    cudaFree(c->lt_ws);
    cudaFreeHost(c->stage);
    for (int i = 0; i < 2; i++)
        if (c->stage_ev[i]) cudaEventDestroy(c->stage_ev[i]);
    cudaFree(c->ranges_dev);
    free(c->ranges_host);
    cudaFree(c->shadow);
    cudaFree(c->head16);
    cudaFree(c->pieces_dev);
    free(c->pieces_host);
    if (c->lt) lt.cublasLtDestroy(c->lt);
    if (c->s) cudaStreamDestroy(c->s);
    free(c);
}

static void cu_close(void *ctx) { ctx_free(ctx); }

static int cu_bf16(void *ctx) { return ((const cuda_ctx *)ctx)->bf16; }

/* bf16 products take bf16 activations: no input is rounded again, and activations take half
 * the memory; fp32 products keep fp32 ones. What stays fp32 either way: the master weights,
 * their gradients (accumulated in fp32 by the products and reductions), AdamW's moments,
 * LayerNorm's mean and rstd (RMSNorm's rstd), the per-row losses, attention's softmax
 * statistics, and inside every kernel the arithmetic (activations are widened on load and
 * rounded once on store). */
static dt_dtype cu_act_dtype(int bf16) { return bf16 ? DT_DTYPE_BF16 : DT_DTYPE_F32; }

/* a multiple of 128 (llm.c's 50304 for GPT-2): every row 16-byte aligned, for bf16 or fp32,
 * as cuBLASLt's vectorized kernels and ours want their operands */
static int cu_logits_stride(int V) { return V > INT_MAX - 127 ? V : (V + 127) / 128 * 128; }

static void cu_describe(void *ctx, dt_backend_desc *d) {
    const cuda_ctx *c = ctx;
    size_t freeb = 0, total = 0;
    if (cudaMemGetInfo(&freeb, &total) != cudaSuccess) total = 0;
    char tot[32];
    human_bytes(tot, sizeof tot, (double)total);
    memset(d, 0, sizeof *d);
    snprintf(d->per_worker, sizeof d->per_worker, "1 GPU");
    snprintf(d->device, sizeof d->device, "GPU %d (%s, %s) on %s", c->device, c->gpu_name, tot, c->host);
    snprintf(d->bus_id, sizeof d->bus_id, "%s", c->bus_id);
}

/* A one-block kernel writes 42 into a device int, which is copied back and checked. */
static dt_status cu_probe(void *ctx) {
    cuda_ctx *c = ctx;
    int *d = NULL, h = 0;
    DT_TRY(cu_check(c));
    DT_TRY(dev_malloc(c, (void **)&d, sizeof(int), "the probe"));
    if (!CK(dtk_probe(c->s, d)) && !CK(cudaMemcpyAsync(&h, d, sizeof h, cudaMemcpyDeviceToHost, c->s)) &&
        !CK(cudaStreamSynchronize(c->s)) && h != 42)
        fail(c, DT_ERR_DEVICE, "the probe kernel on rank %d (host %s, GPU %d %s) wrote %d, expected 42", c->rank,
             c->host, c->device, c->gpu_name, h);
    cudaFree(d);
    return cu_check(c);
}

/* the range a profiler records (logging.profile_step): the caller waited for the queue */
static void cu_profile(void *ctx, int on) {
    cuda_ctx *c = ctx;
    if (c->err == DT_OK) CK(on ? cudaProfilerStart() : cudaProfilerStop());
}

/* NCCL for device buffers, ordered after this backend's stream. */
static dt_status cu_device_comm(void *ctx, dt_comm *boot, double timeout_s, dt_comm **out) {
    cuda_ctx *c = ctx;
    return dt_comm_init_nccl(out, boot, c->device, c->s, timeout_s);
}

static dt_status cu_open(const dt_backend_cfg *cfg, void **out) {
    *out = NULL;
    const int device = cfg->device, rank = cfg->rank, precision = cfg->precision;
    cuda_ctx *c = dt_calloc(1, sizeof *c, "CUDA op context");
    if (!c) return DT_ERR_NOMEM;
    c->device = device;
    c->rank = rank;
    c->inference = cfg->inference;
    if (gethostname(c->host, sizeof c->host) != 0) snprintf(c->host, sizeof c->host, "?");
    c->host[sizeof c->host - 1] = '\0';
    snprintf(c->gpu_name, sizeof c->gpu_name, "?");
    dt_status st = DT_OK;
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || device >= count) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        st = dt_error_set(DT_ERR_CONFIG, "rank %d (host %s): GPU %d is not usable: %s (CUDA_VISIBLE_DEVICES=%s) (hint: "
                          "one worker per visible GPU: lower training.num_workers (or, under a launcher, its "
                          "processes per host), or check nvidia-smi)", rank, c->host,
                          device, e != cudaSuccess ? cudaGetErrorString(e) : "fewer GPUs are visible",
                          vis ? vis : "unset");
        goto fail;
    }
    struct cudaDeviceProp prop;
    memset(&prop, 0, sizeof prop);
    if (!CK(cudaSetDevice(device)) && !CK(cudaGetDeviceProperties(&prop, device))) {
        snprintf(c->gpu_name, sizeof c->gpu_name, "%s", prop.name);
        snprintf(c->bus_id, sizeof c->bus_id, "%08X:%02X:%02X.0", (unsigned)prop.pciDomainID, (unsigned)prop.pciBusID,
                 (unsigned)prop.pciDeviceID);
    }
    /* bf16 products need compute capability 8.0 (A100) or newer: auto falls back to fp32 */
    c->bf16 = precision > 0 || (precision < 0 && prop.major >= 8);
    if (c->err == DT_OK && c->bf16 && prop.major < 8)
        fail(c, DT_ERR_CONFIG, "rank %d (host %s): GPU %d (%s, compute capability %d.%d) has no bf16 tensor cores "
             "(hint: training.precision: fp32)", rank, c->host, device, c->gpu_name, prop.major, prop.minor);
    if (c->err == DT_OK) CK(cudaStreamCreateWithFlags(&c->s, cudaStreamNonBlocking));
    if (c->err != DT_OK) {
        st = dt_error_set(c->err, "%s", c->err_msg);
        goto fail;
    }
    pthread_once(&lt_once, lt_load);
    if (lt_error[0]) { /* the same on every restart: a configuration error (exit 2), not retried */
        st = dt_error_set(DT_ERR_CONFIG, "rank %d (host %s): %s", rank, c->host, lt_error);
        goto fail;
    }
    if (CKLT(lt.cublasLtCreate(&c->lt))) {
        st = dt_error_set(c->err, "%s", c->err_msg);
        goto fail;
    }
    if ((st = dev_malloc(c, &c->lt_ws, LT_WORKSPACE, "the cuBLASLt workspace")) != DT_OK ||
        (st = dev_malloc(c, (void **)&c->ranges_dev, N_RANGES * sizeof *c->ranges_dev, "the ranges' table")) != DT_OK ||
        (st = dev_malloc(c, (void **)&c->pieces_dev, ADAMW_PIECES * sizeof *c->pieces_dev, "the AdamW table")) != DT_OK)
        goto fail;
    if (!(c->pieces_host = dt_malloc(ADAMW_PIECES * sizeof *c->pieces_host, "the AdamW table")) ||
        !(c->ranges_host = dt_malloc(N_RANGES * sizeof *c->ranges_host, "the ranges' table"))) {
        st = DT_ERR_NOMEM;
        goto fail;
    }
    c->cap_pieces = ADAMW_PIECES;
    if (CK(cudaEventCreateWithFlags(&c->stage_ev[0], cudaEventDisableTiming)) ||
        CK(cudaEventCreateWithFlags(&c->stage_ev[1], cudaEventDisableTiming))) {
        st = dt_error_set(c->err, "%s", c->err_msg);
        goto fail;
    }
    if ((st = stage_grow(c, STAGE_MIN_HALF)) != DT_OK) goto fail;
    *out = c;
    return DT_OK;
fail:
    ctx_free(c);
    return st;
}

/* The size each scratch slot grows to for op sizes `s` (upper bounds). with_cub: include the
 * embedding backward's sort space, which asks the CUDA runtime (only once a device is open). */
static void slot_bytes(const dt_op_sizes *s, int bf16, int with_cub, int fused, size_t att_ws, size_t sz[N_SCRATCH]) {
    const size_t nq = att_q_elems(&s->att), nkv = att_kv_elems(&s->att);
    const size_t probs = (size_t)s->att.B * (size_t)s->att.NH * (size_t)s->att.T * (size_t)s->att.T;
    memset(sz, 0, N_SCRATCH * sizeof *sz);
    if (fused) sz[SCR_CUDNN] = att_ws; /* cuDNN reads and writes the activations themselves */
    else sz[SCR_ATT] = (3 * nq + 4 * nkv) * sizeof(float); /* attention backward's q k v dy dq dk dv */
    if (fused && s->att.pos) sz[SCR_MASK] = ATT_MASK_BYTES(s->att.B, s->att.T); /* packed rows' mask */
    if (bf16 && !fused) { /* bf16 copies of the fp32 operands of attention's products: q, k, v, dy, P */
        sz[SCR_A16] = nq * 2; /* k, v, dy (A operands; nkv <= nq) */
        sz[SCR_B16] = (probs > nq ? probs : nq) * 2;
    }
    if (bf16) { /* and of LoRA's h and dh (cu_lora_fwd, cu_lora_bwd): an A operand in dB's product, a B in the others */
        if (s->lora_h * 2 > sz[SCR_A16]) sz[SCR_A16] = s->lora_h * 2;
        if (s->lora_h * 2 > sz[SCR_B16]) sz[SCR_B16] = s->lora_h * 2;
    }
    size_t w = dtk_bias_bwd_work_bytes(s->bias_rows, s->bias_cols), x = dtk_layernorm_bwd_work_bytes(s->ln_rows, s->ln_width);
    size_t y = dtk_sumsq_work_bytes(s->vector);
    size_t z = with_cub ? dtk_encoder_bwd_work_bytes(s->enc_batch, s->enc_seq, s->enc_width) : 0;
    sz[SCR_WORK] = w > x ? w : x; /* x also covers rmsnorm_bwd's (one sum a column, not two) */
    if (y > sz[SCR_WORK]) sz[SCR_WORK] = y;
    if (z > sz[SCR_WORK]) sz[SCR_WORK] = z;
    const int cols = s->bias_cols > s->ln_width ? s->bias_cols : s->ln_width;
    sz[SCR_FLAGS] = (size_t)dtk_colsum_flags(cols) * sizeof(unsigned);
    if (bf16) { /* the fp32 fallback's operands (a bf16 input or output of the products widened), each
                 * at most a slot: a larger product runs in pieces */
        const size_t most = (s->matmul_in > s->matmul_out ? s->matmul_in : s->matmul_out) * sizeof(float);
        sz[SCR_A32] = sz[SCR_B32] = sz[SCR_D32] = most < fp32_slot_bytes() ? most : fp32_slot_bytes();
    }
}

static size_t cu_scratch_bytes(const dt_op_sizes *s, int bf16) {
    size_t sz[N_SCRATCH], bytes = LT_WORKSPACE;
    /* as on a device on which cuDNN plans: bf16 fused (where any could, attention_bytes) */
    slot_bytes(s, bf16, 0, bf16 && att_may_fuse(&s->att), ATT_WS_GUESS(s->att.B, s->att.T, s->att.NH), sz);
    for (int i = 0; i < N_SCRATCH; i++) bytes += sz[i] ? slot_round(sz[i]) : 0; /* as scratch() allocates */
    if (bf16) bytes += s->vector * 2; /* the weights' working copy */
    if (bf16 && !s->head_bf16 && cu_logits_stride(s->head_rows) > s->head_rows) /* its padded head */
        bytes += (size_t)cu_logits_stride(s->head_rows) * (size_t)s->head_in * sizeof(dtk_bf16);
    /* + AdamW's table and the ranges' (made at open) */
    return bytes + ADAMW_PIECES * sizeof(dtk_adamw_piece) + N_RANGES * sizeof(dtk_range);
}

static dt_status cu_reserve(void *ctx, const dt_op_sizes *s) {
    cuda_ctx *c = ctx;
    static const char *const what[N_SCRATCH] = {"bf16 matmul inputs", "bf16 matmul inputs", "attention scratch",
                                                "kernel scratch", "the cuDNN attention workspace",
                                                "fp32 matmul operands", "fp32 matmul operands",
                                                "fp32 matmul operands", "the column reductions' counters",
                                                "the packed rows' attention mask"};
    size_t sz[N_SCRATCH], ws = 0;
    const int fused = att_fused(c, &s->att);
    if (fused && !att_workspace(c, &s->att, !c->inference, &ws)) return cu_check(c);
    slot_bytes(s, c->bf16, 1, fused, ws, sz);
    if (s->enc_vocab > c->enc_vocab) c->enc_vocab = s->enc_vocab; /* grows, as the scratch: every model's tokens fit */
    for (int i = 0; i < N_SCRATCH; i++)
        if (sz[i] && !scratch(c, i, sz[i], what[i])) break;
    c->base_head_rows = s->head_bf16 ? s->head_rows : 0; /* the model's frozen bf16 head and its padding */
    c->base_head_in = s->head_in;
    c->base_head_pad = cu_logits_stride(s->head_rows);
    if (c->head16 && (s->head_rows != c->head_rows || s->head_in != c->head_in)) { /* another model's */
        if (CK(cudaFree(c->head16))) return cu_check(c);
        c->head16 = NULL;
    }
    if (c->err == DT_OK && c->bf16 && !c->head16 && !s->head_bf16 && s->head_rows > 0 && s->head_in > 0 &&
        cu_logits_stride(s->head_rows) > s->head_rows) {
        const int pad = cu_logits_stride(s->head_rows);
        const size_t hb = (size_t)pad * (size_t)s->head_in * sizeof(dtk_bf16);
        DT_TRY(dev_malloc(c, (void **)&c->head16, hb, "the padded bf16 output head"));
        if (CK(cudaMemsetAsync(c->head16, 0, hb, c->s))) return cu_check(c);
        c->head_rows = s->head_rows;
        c->head_in = s->head_in;
        c->head_pad = pad;
        c->head16_of = NULL;
    }
    const size_t half = STAGE_FORWARDS * (s->inputs + 3 * 256); /* each upload's copy 256-byte aligned */
    if (c->err == DT_OK) DT_TRY(stage_grow(c, half > STAGE_MIN_HALF ? half : STAGE_MIN_HALF));
    return cu_check(c);
}

/* ---- library versions ---- */

/* cuBLAS, NCCL (>= 2.9) and cuDNN 9: major*10000 + minor*100 + patch; cuDNN 8: major*1000 + ... */
static void mmp(long v, int cudnn8, int *ma, int *mi, int *pa) {
    long d = cudnn8 ? 1000 : 10000;
    *ma = (int)(v / d);
    *mi = (int)(v % d / 100);
    *pa = (int)(v % 100);
}

/* Appends "  NAME  runtime X (built with Y)[  MISMATCH: why]"; returns 1 on a mismatch. */
static int line(char *buf, size_t n, size_t *k, const char *name, const char *now, const char *built, const char *why) {
    if (*k < n)
        *k += (size_t)snprintf(buf + *k, n - *k, "  %-9s %s (built with %s)%s%s\n", name, now, built,
                               why ? "  MISMATCH: " : "", why ? why : "");
    return why != NULL;
}

/* The version a library reports at run time, loaded only for this question: `sym` is
 * size_t (void) (cuBLASLt, cuDNN) or ncclResult_t (int *) (nccl_style). -1 when the library
 * or the symbol is not there. */
static long lib_version(const char *soname, const char *sym, int nccl_style) {
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
    if (!h) return -1;
    long v = -1;
    void *f = dlsym(h, sym);
    if (f && nccl_style) {
        int x = 0;
        if (((ncclResult_t(*)(int *))f)(&x) == ncclSuccess) v = x;
    } else if (f) {
        v = (long)((size_t(*)(void))f)();
    }
    dlclose(h);
    return v;
}

/* A library GPU workers open and this machine lacks: a mismatch where a driver is there to use
 * it; without a driver (a CPU machine running a CUDA build, e.g. the .deb) only a note. */
static int missing(char *buf, size_t n, size_t *k, const char *name, const char *soname, int drv) {
    if (*k < n && drv > 0)
        *k += (size_t)snprintf(buf + *k, n - *k, "  %-9s %s not found  MISMATCH: install it (GPU workers open it), or add "
                               "its directory to LD_LIBRARY_PATH\n", name, soname);
    else if (*k < n)
        *k += (size_t)snprintf(buf + *k, n - *k, "  %-9s %s not found (only GPU workers need it)\n", name, soname);
    return drv > 0;
}

static int cu_versions_here(char *buf, size_t n) {
    int rt = 0, drv = 0, bad = 0;
    size_t k = 0;
    char now[64], built[64];
    if (n) buf[0] = '\0';
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess) rt = 0;
    if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
    if (drv > 0)
        snprintf(now, sizeof now, "runtime %d.%d, driver supports %d.%d", rt / 1000, rt % 1000 / 10, drv / 1000,
                 drv % 1000 / 10);
    else /* not a mismatch: a machine without a GPU */
        snprintf(now, sizeof now, "runtime %d.%d, no NVIDIA driver (CPU only)", rt / 1000, rt % 1000 / 10);
    snprintf(built, sizeof built, "%d.%d", CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    /* CUDA's minor-version compatibility: within a major version a newer runtime runs on an
     * older driver (no PTX JIT of newer code), so only a major gap is a mismatch */
    const char *why = NULL;
    if (rt / 1000 != CUDART_VERSION / 1000) why = "another major CUDA runtime than dtrain was built with";
    else if (drv > 0 && drv / 1000 < rt / 1000) why = "the driver is a major version older than the CUDA runtime: update the driver";
    bad += line(buf, n, &k, "CUDA", now, built, why);
    if (!why && drv > 0 && drv < rt && k < n)
        k += (size_t)snprintf(buf + k, n - k, "  note: the driver (%d.%d) is older than the runtime (%d.%d): supported "
                                              "within a major version, but newer PTX cannot be JIT-compiled\n",
                              drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);

    /* the libraries GPU workers open: each found one against the version built with */
    const struct {
        const char *name, *fmt, *sym;
        int major, nccl_style;
    } libs[] = {{"cuBLASLt", "libcublasLt.so.%d", "cublasLtGetVersion", CUBLAS_VER_MAJOR, 0},
                {"cuDNN", "libcudnn.so.%d", "cudnnGetVersion", CUDNN_MAJOR, 0},
                {"NCCL", "libnccl.so.%d", "ncclGetVersion", NCCL_MAJOR, 1}};
    for (size_t i = 0; i < sizeof libs / sizeof libs[0]; i++) {
        char soname[64];
        snprintf(soname, sizeof soname, libs[i].fmt, libs[i].major);
        long v = lib_version(soname, libs[i].sym, libs[i].nccl_style);
        if (v < 0) {
            bad += missing(buf, n, &k, libs[i].name, soname, drv);
            continue;
        }
        int ma, mi, pa, bma, bmi, bpa;
        const char *why = NULL;
        if (i == 0) {
            mmp(v, 0, &ma, &mi, &pa);
            mmp(CUBLAS_VERSION, 0, &bma, &bmi, &bpa);
            if (ma != bma) why = "another major version of cuBLAS";
        } else if (i == 1) {
            mmp(v, v < 90000, &ma, &mi, &pa);
            mmp(CUDNN_VERSION, CUDNN_VERSION < 90000, &bma, &bmi, &bpa);
            if (ma != bma) why = "another major version of cuDNN";
            else if (mi < bmi) why = "an older cuDNN than dtrain was built with";
        } else {
            mmp(v, 0, &ma, &mi, &pa);
            mmp(NCCL_VERSION_CODE, 0, &bma, &bmi, &bpa);
            if (ma != bma || mi < bmi) why = "an older or other NCCL than dtrain was built with";
        }
        snprintf(now, sizeof now, "%d.%d.%d", ma, mi, pa);
        snprintf(built, sizeof built, "%d.%d.%d", bma, bmi, bpa);
        bad += line(buf, n, &k, libs[i].name, now, built, why);
    }
    return bad;
}

/* The report above, made in a child process: cudaDriverGetVersion initialises CUDA in the
 * process that asks, and CUDA does not survive fork, so a parent that asked and then forked its
 * workers (`dtrain doctor --device cuda`) saw every worker fail cudaSetDevice with
 * cudaErrorInitializationError on an H200. The parent never touches CUDA; where fork fails the
 * report is made here, which only a later fork would regret. */
static int cu_versions(char *buf, size_t n) {
    int fd[2];
    if (n == 0 || pipe(fd) != 0) return cu_versions_here(buf, n);
    fflush(NULL); /* the child inherits empty buffers: cuBLASLt's unload flushes stdout there */
    const pid_t pid = fork();
    if (pid < 0) {
        close(fd[0]);
        close(fd[1]);
        return cu_versions_here(buf, n);
    }
    if (pid == 0) { /* the child: the report, its verdict first, then out without atexit or stdio */
        close(fd[0]);
        char *text = malloc(n);
        int bad = text ? cu_versions_here(text, n) : -1;
        size_t len = text ? strnlen(text, n) : 0, off = 0;
        ssize_t w = write(fd[1], &bad, sizeof bad);
        while (w >= 0 && off < len && (w = write(fd[1], text + off, len - off)) > 0) off += (size_t)w;
        _exit(w < 0 || bad < 0 ? 1 : 0);
    }
    close(fd[1]);
    int bad = -1;
    size_t got = 0, k = 0;
    char *p = (char *)&bad;
    for (;;) { /* the verdict's bytes, then the text, until the child closes its end */
        char c[512];
        const ssize_t r = read(fd[0], c, sizeof c);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        for (ssize_t i = 0; i < r; i++)
            if (got < sizeof bad) p[got++] = c[i];
            else if (k + 1 < n) buf[k++] = c[i];
    }
    close(fd[0]);
    buf[k] = '\0';
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
    if (got < sizeof bad || bad < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(buf, n, "  CUDA      the version report failed (its process %s %d)\n",
                 WIFSIGNALED(status) ? "died of signal" : "exited", WIFSIGNALED(status) ? WTERMSIG(status)
                                                                                     : WEXITSTATUS(status));
        return 1;
    }
    return bad;
}

const dt_ops dt_ops_cuda = {
    .name = "cuda",
    .memory = "GPU memory",
    .collective = "nccl",
    .short_rows = 0, /* not yet: each new length builds cuDNN graphs and cuBLASLt plans mid-run, and their
                        workspaces and build times are unmeasured on a GPU */
    .act_dtype = cu_act_dtype,
    .logits_stride = cu_logits_stride,
    .scratch_bytes = cu_scratch_bytes,
    .versions = cu_versions,
    .open = cu_open,
    .close = cu_close,
    .describe = cu_describe,
    .bf16 = cu_bf16,
    .reserve = cu_reserve,
    .probe = cu_probe,
    .profile = cu_profile,
    .device_comm = cu_device_comm,
    .device_comm_bytes = dt_comm_nccl_device_bytes,
    .alloc = cu_alloc,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .zero = cu_zero,
    .copy = cu_copy,
    .upload_async = cu_upload_async,
    .alloc_host = cu_alloc_host,
    .free_host = cu_free_host,
    .download_async = cu_download_async,
    .encoder_fwd = cu_encoder_fwd,
    .encoder_bwd = cu_encoder_bwd,
    .layernorm_fwd = cu_layernorm_fwd,
    .layernorm_bwd = cu_layernorm_bwd,
    .rmsnorm_fwd = cu_rmsnorm_fwd,
    .rmsnorm_bwd = cu_rmsnorm_bwd,
    .matmul_fwd = cu_matmul_fwd,
    .matmul_bwd = cu_matmul_bwd,
    .matmul16_fwd = cu_matmul16_fwd,
    .matmul16_bwd = cu_matmul16_bwd,
    .encoder16_fwd = cu_encoder16_fwd,
    .matmul_gelu_fwd = cu_matmul_gelu_fwd,
    .matmul_gelu_bwd = cu_matmul_gelu_bwd,
    .attention_bytes = cu_attention_bytes,
    .attention_fwd = cu_attention_fwd,
    .attention_bwd = cu_attention_bwd,
    .attention_cached = cu_attention_cached,
    .rope_fwd = cu_rope_fwd,
    .rope_bwd = cu_rope_bwd,
    .swiglu_fwd = cu_swiglu_fwd,
    .swiglu_bwd = cu_swiglu_bwd,
    .lora_fwd = cu_lora_fwd,
    .lora_bwd = cu_lora_bwd,
    .gelu_fwd = cu_gelu_fwd,
    .gelu_bwd = cu_gelu_bwd,
    .add = cu_add,
    .xent_fwd = cu_xent_fwd,
    .xent_bwd = cu_xent_bwd,
    .xent_fused = cu_xent_fused,
    .encoder_part_fwd = cu_encoder_part_fwd,
    .encoder_part_bwd = cu_encoder_part_bwd,
    .xent_part_stats = cu_xent_part_stats,
    .xent_part_bwd = cu_xent_part_bwd,
    .argmax = cu_argmax,
    .gather_rows = cu_gather_rows,
    .scatter_add_rows = cu_scatter_add_rows,
    .adamw = cu_adamw,
    .sumsq = cu_sumsq,
    .scale = cu_scale,
    .loss_sum = cu_loss_sum,
    .set_master = cu_set_master,
    .check = cu_check,
};
