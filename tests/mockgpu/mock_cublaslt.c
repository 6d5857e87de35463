/* mock_cublaslt.c — libcublasLt.so.13 on the CPU, for the functions src/ops/ops_cuda.c loads with
 * dlopen, with cuBLASLt's column-major semantics and strict argument checks:
 *
 *   D = alpha op(A) op(B) + beta C [+ bias on every column], per batch with strides.
 *   A, B: CUDA_R_32F or CUDA_R_16BF (the same type); C, D: CUDA_R_32F, or CUDA_R_16BF (both) with
 *   16BF inputs; compute CUBLAS_COMPUTE_32F (or _FAST_* / _PEDANTIC); scale CUDA_R_32F; host
 *   pointer mode; epilogue DEFAULT, BIAS, GELU_AUX, GELU_AUX_BIAS, DGELU or BGRADA, the bias (or
 *   bias gradient) and the aux matrix of D's type (as cublasLt.h documents; GELU the tanh form,
 *   as cuBLASLt's; batch 1 for all but BIAS).
 *   Computed in double, rounded to float once (then to bf16, nearest even, for a 16BF D), in
 *   stream order on the matmul's stream. Only the
 *   attributes ops_cuda.c sets are accepted (any other is a NOT_SUPPORTED error).
 *
 * Checks (each failure prints "MOCK ERROR: cuBLASLt ..." and returns INVALID_VALUE or
 * NOT_SUPPORTED, as the real library would):
 *   - attribute sizes; layout ld >= rows (column order); op(A) m x k, op(B) k x n, C and D
 *     m x n; equal batch counts; D batches that do not overlap; C == D only with one layout;
 *   - D overlapping A or B (cuBLASLt does not support an output that aliases an input);
 *   - every matrix, the bias vector and the workspace inside one device allocation (extents
 *     from rows, cols, ld, stride and batch count: a wrong ld or stride shows as an overrun);
 *   - pointers at least as aligned as the preference promised (MIN_ALIGNMENT_*_BYTES), each
 *     product's of a batch too (the stride's bytes count);
 *   - the algo came from the heuristic for the same shapes, transposes and epilogue.
 * MOCK_LT_NO_BIAS_EPILOGUE=1: the heuristic finds no algorithm with the bias epilogue (as for
 * some shapes on real GPUs), to exercise the caller's fallback. MOCK_LT_NO_BF16=1: it finds none
 * for bf16 inputs (an old GPU, or a shape the library has no kernel for), to exercise the
 * caller's fp32 fallback. MOCK_LT_NO_GELU_EPILOGUE=1: none with a GELU epilogue (the caller's
 * product + GELU kernel); an aux ld not divisible by 8 finds none either, as cuBLASLt requires.
 * MOCK_LT_NO_BGRAD_EPILOGUE=1: none with BGRADA (the caller's column sums). Each of the three
 * set to "invalid" refuses with CUBLAS_STATUS_INVALID_VALUE instead of NOT_SUPPORTED, as real
 * cuBLASLt can for an epilogue and type combination it lacks.
 * MOCK_LT_TRACE=1 prints every matmul.
 *
 * Deliberately not modelled: which algorithms, epilogues and alignments a real GPU offers
 * (the heuristic always returns one algorithm, with no workspace; the only rule assumed is
 * that a bias epilogue needs a 16-byte aligned bias vector, which is what the fused epilogue
 * kernels load vectorised); tensor-core rounding (TF32, bf16 products accumulated in another
 * order); other types, orders, epilogues and device pointer mode (rejected as NOT_SUPPORTED). */
#define _GNU_SOURCE
#include <cublasLt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mock_api.h"

#define MAGIC_H 0x4c54484e
#define MAGIC_D 0x4c544443
#define MAGIC_L 0x4c54414c
#define MAGIC_P 0x4c545052
#define MAGIC_A 0x4c54414cULL

typedef struct mlayout {
    uint32_t magic;
    int32_t type;
    uint64_t rows, cols;
    int64_t ld, stride;
    int32_t batch;
} mlayout;
typedef struct mdesc {
    uint32_t magic;
    int32_t compute, ta, tb;
    uint32_t epi;
    const void *bias;
    int32_t bias_type;
    void *aux; /* GELU_AUX*: written (the pre-GELU product), DGELU: read; of D's type */
    int64_t aux_ld;
} mdesc;

static int has_bias(uint32_t e) { return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS; }
static int has_aux(uint32_t e) {
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}
typedef struct mpref {
    uint32_t magic;
    uint64_t ws;
    uint32_t al[4];
} mpref;
struct cublasLtContext { uint32_t magic; };

#define FAIL(st, ...)                                                                                                  \
    do {                                                                                                               \
        char m_[600];                                                                                                  \
        snprintf(m_, sizeof m_, __VA_ARGS__);                                                                          \
        mock_report("cuBLASLt %s: %s", fn, m_);                                                                        \
        return (st);                                                                                                   \
    } while (0)

/* the version of the headers it is built with (dtrain doctor compares it with dtrain's) */
size_t cublasLtGetVersion(void) { return CUBLAS_VERSION; }

const char *cublasLtGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_UNKNOWN";
    }
}

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h) {
    const char *fn = "cublasLtCreate";
    if (!h) FAIL(CUBLAS_STATUS_INVALID_VALUE, "NULL handle pointer");
    *h = calloc(1, sizeof **h);
    (*h)->magic = MAGIC_H;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h) {
    const char *fn = "cublasLtDestroy";
    if (!h || h->magic != MAGIC_H) FAIL(CUBLAS_STATUS_NOT_INITIALIZED, "bad handle");
    h->magic = 0;
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- descriptors ---- */

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct, cudaDataType_t st) {
    const char *fn = "cublasLtMatmulDescCreate";
    if (!d) FAIL(CUBLAS_STATUS_INVALID_VALUE, "NULL pointer");
    if (ct != CUBLAS_COMPUTE_32F && ct != CUBLAS_COMPUTE_32F_FAST_TF32 && ct != CUBLAS_COMPUTE_32F_FAST_16BF &&
        ct != CUBLAS_COMPUTE_32F_PEDANTIC)
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "the mock supports the 32F compute types only (got %d)", (int)ct);
    if (st != CUDA_R_32F)
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "scale type %d with a 32F compute type (must be CUDA_R_32F)", (int)st);
    mdesc *m = calloc(1, sizeof *m);
    m->magic = MAGIC_D;
    m->compute = ct;
    m->ta = m->tb = CUBLAS_OP_N;
    m->epi = CUBLASLT_EPILOGUE_DEFAULT;
    m->bias_type = -1;
    *d = (cublasLtMatmulDesc_t)m;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d) {
    const char *fn = "cublasLtMatmulDescDestroy";
    mdesc *m = (mdesc *)d;
    if (!m) return CUBLAS_STATUS_SUCCESS;
    if (m->magic != MAGIC_D) FAIL(CUBLAS_STATUS_INVALID_VALUE, "not a matmul descriptor (double destroy?)");
    m->magic = 0;
    free(m);
    return CUBLAS_STATUS_SUCCESS;
}

/* m->field = the attribute value in buf, which must have exactly its size */
#define SETV(field, type)                                                                                              \
    do {                                                                                                               \
        if (n != sizeof(type))                                                                                         \
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "attribute %s: size %zu, expected %zu", #field, n, sizeof(type));        \
        type v_;                                                                                                       \
        memcpy(&v_, buf, sizeof v_);                                                                                   \
        m->field = v_;                                                                                                 \
    } while (0)

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, const void *buf,
                                              size_t n) {
    const char *fn = "cublasLtMatmulDescSetAttribute";
    mdesc *m = (mdesc *)d;
    if (!m || m->magic != MAGIC_D) FAIL(CUBLAS_STATUS_INVALID_VALUE, "not a matmul descriptor");
    if (!buf) FAIL(CUBLAS_STATUS_INVALID_VALUE, "NULL buffer");
    switch (a) {
    case CUBLASLT_MATMUL_DESC_TRANSA: SETV(ta, int32_t); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: SETV(tb, int32_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: SETV(epi, uint32_t); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: SETV(bias, const void *); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: SETV(bias_type, int32_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: SETV(aux, void *); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: SETV(aux_ld, int64_t); break;
    default: FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "attribute %d not supported by the mock", (int)a);
    }
    if (m->ta != CUBLAS_OP_N && m->ta != CUBLAS_OP_T) FAIL(CUBLAS_STATUS_INVALID_VALUE, "TRANSA %d", m->ta);
    if (m->tb != CUBLAS_OP_N && m->tb != CUBLAS_OP_T) FAIL(CUBLAS_STATUS_INVALID_VALUE, "TRANSB %d", m->tb);
    if (m->epi != CUBLASLT_EPILOGUE_DEFAULT && !has_bias(m->epi) && !has_aux(m->epi) && m->epi != CUBLASLT_EPILOGUE_BGRADA)
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "epilogue %u not supported by the mock", m->epi);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows, uint64_t cols,
                                          int64_t ld) {
    const char *fn = "cublasLtMatrixLayoutCreate";
    if (!l) FAIL(CUBLAS_STATUS_INVALID_VALUE, "NULL pointer");
    if (type != CUDA_R_32F && type != CUDA_R_16BF)
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "type %d not supported by the mock", (int)type);
    if (rows > INT32_MAX || cols > INT32_MAX)
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "rows %llu cols %llu", (unsigned long long)rows, (unsigned long long)cols);
    if (ld < 0) FAIL(CUBLAS_STATUS_INVALID_VALUE, "negative ld %lld", (long long)ld);
    mlayout *m = calloc(1, sizeof *m);
    m->magic = MAGIC_L;
    m->type = type;
    m->rows = rows;
    m->cols = cols;
    m->ld = ld;
    m->batch = 1;
    *l = (cublasLtMatrixLayout_t)m;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l) {
    const char *fn = "cublasLtMatrixLayoutDestroy";
    mlayout *m = (mlayout *)l;
    if (!m) return CUBLAS_STATUS_SUCCESS;
    if (m->magic != MAGIC_L) FAIL(CUBLAS_STATUS_INVALID_VALUE, "not a layout (double destroy?)");
    m->magic = 0;
    free(m);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a,
                                                const void *buf, size_t n) {
    const char *fn = "cublasLtMatrixLayoutSetAttribute";
    mlayout *m = (mlayout *)l;
    if (!m || m->magic != MAGIC_L) FAIL(CUBLAS_STATUS_INVALID_VALUE, "not a layout");
    if (!buf) FAIL(CUBLAS_STATUS_INVALID_VALUE, "NULL buffer");
    switch (a) {
    case CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT: SETV(batch, int32_t); break;
    case CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET: SETV(stride, int64_t); break;
    default: FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "layout attribute %d not supported by the mock", (int)a);
    }
    if (m->batch < 1) FAIL(CUBLAS_STATUS_INVALID_VALUE, "batch count %d", m->batch);
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) {
    const char *fn = "cublasLtMatmulPreferenceCreate";
    if (!p) FAIL(CUBLAS_STATUS_INVALID_VALUE, "NULL pointer");
    mpref *m = calloc(1, sizeof *m);
    m->magic = MAGIC_P;
    for (int i = 0; i < 4; i++) m->al[i] = 256; /* cuBLASLt's default: assume 256-byte aligned pointers */
    *p = (cublasLtMatmulPreference_t)m;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p) {
    const char *fn = "cublasLtMatmulPreferenceDestroy";
    mpref *m = (mpref *)p;
    if (!m) return CUBLAS_STATUS_SUCCESS;
    if (m->magic != MAGIC_P) FAIL(CUBLAS_STATUS_INVALID_VALUE, "not a preference (double destroy?)");
    m->magic = 0;
    free(m);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void *buf, size_t n) {
    const char *fn = "cublasLtMatmulPreferenceSetAttribute";
    mpref *m = (mpref *)p;
    if (!m || m->magic != MAGIC_P) FAIL(CUBLAS_STATUS_INVALID_VALUE, "not a preference");
    if (!buf) FAIL(CUBLAS_STATUS_INVALID_VALUE, "NULL buffer");
    switch (a) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: SETV(ws, uint64_t); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: SETV(al[0], uint32_t); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: SETV(al[1], uint32_t); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: SETV(al[2], uint32_t); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: SETV(al[3], uint32_t); break;
    default: FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "preference attribute %d not supported by the mock", (int)a);
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- validation ---- */

static size_t tsize(int t) { return t == CUDA_R_32F ? 4 : 2; }
static const char *tname(int t) { return t == CUDA_R_32F ? "32F" : t == CUDA_R_16BF ? "16BF" : "?"; }
static const mlayout *L_(cublasLtMatrixLayout_t l) { return (const mlayout *)l; }

/* Shapes, types, batches: what the heuristic and the matmul both check. m, n, k out. */
static cublasStatus_t validate(const char *fn, const mdesc *d, const mlayout *a, const mlayout *b, const mlayout *c,
                               const mlayout *dd, int *pm, int *pn, int *pk) {
    if (!d || d->magic != MAGIC_D) FAIL(CUBLAS_STATUS_INVALID_VALUE, "bad matmul descriptor");
    const mlayout *ls[4] = {a, b, c, dd};
    const char *nm = "ABCD";
    for (int i = 0; i < 4; i++) {
        if (!ls[i] || ls[i]->magic != MAGIC_L) FAIL(CUBLAS_STATUS_INVALID_VALUE, "bad layout for %c", nm[i]);
        if (ls[i]->ld < (int64_t)(ls[i]->rows ? ls[i]->rows : 1))
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "%c: ld %lld < rows %llu (column-major needs ld >= rows)", nm[i],
                 (long long)ls[i]->ld, (unsigned long long)ls[i]->rows);
    }
    if (a->type != b->type) FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "A type %s != B type %s", tname(a->type), tname(b->type));
    if (c->type != dd->type || (dd->type != CUDA_R_32F && (dd->type != CUDA_R_16BF || a->type != CUDA_R_16BF)))
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "the mock supports 32F C and D, or 16BF ones with 16BF inputs (A %s, C %s, "
             "D %s)", tname(a->type), tname(c->type), tname(dd->type));
    if (a->type != CUDA_R_32F && d->compute == CUBLAS_COMPUTE_32F_FAST_TF32)
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "FAST_TF32 compute with %s inputs", tname(a->type));
    const uint64_t am = d->ta == CUBLAS_OP_N ? a->rows : a->cols, ak = d->ta == CUBLAS_OP_N ? a->cols : a->rows;
    const uint64_t bk = d->tb == CUBLAS_OP_N ? b->rows : b->cols, bn = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
    if (am != dd->rows || bn != dd->cols || ak != bk) {
        typedef unsigned long long ull;
        FAIL(CUBLAS_STATUS_INVALID_VALUE,
             "shapes do not chain: op%s(A) is %llux%llu (A stored %llux%llu), op%s(B) is %llux%llu (B stored "
             "%llux%llu), D is %llux%llu", d->ta == CUBLAS_OP_N ? "N" : "T", (ull)am, (ull)ak, (ull)a->rows,
             (ull)a->cols, d->tb == CUBLAS_OP_N ? "N" : "T", (ull)bk, (ull)bn, (ull)b->rows, (ull)b->cols,
             (ull)dd->rows, (ull)dd->cols);
    }
    if (c->rows != dd->rows || c->cols != dd->cols)
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "C is %llux%llu, D %llux%llu", (unsigned long long)c->rows,
             (unsigned long long)c->cols, (unsigned long long)dd->rows, (unsigned long long)dd->cols);
    if (a->batch != dd->batch || b->batch != dd->batch || c->batch != dd->batch)
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "batch counts differ: A %d B %d C %d D %d", a->batch, b->batch, c->batch,
             dd->batch);
    if (dd->batch > 1 && dd->stride < dd->ld * (int64_t)dd->cols)
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "D batches overlap: stride %lld < ld*cols %lld", (long long)dd->stride,
             (long long)(dd->ld * (int64_t)dd->cols));
    if ((has_bias(d->epi) || d->epi == CUBLASLT_EPILOGUE_BGRADA) && d->bias_type != -1 && d->bias_type != dd->type)
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "bias type %s with a %s output (the bias is of D's type)",
             tname(d->bias_type), tname(dd->type));
    if (has_aux(d->epi) && d->aux_ld < (int64_t)dd->rows)
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "epilogue aux ld %lld < D's rows %llu", (long long)d->aux_ld,
             (unsigned long long)dd->rows);
    if ((has_aux(d->epi) || d->epi == CUBLASLT_EPILOGUE_BGRADA) && dd->batch != 1)
        FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "a GELU or BGRADA epilogue with batch %d (the mock supports 1)", dd->batch);
    *pm = (int)dd->rows;
    *pn = (int)dd->cols;
    *pk = (int)ak;
    return CUBLAS_STATUS_SUCCESS;
}

/* what an algo is valid for: the heuristic stores it in the algo, the matmul compares */
static uint64_t shape_hash(const mdesc *d, const mlayout *a, const mlayout *b, const mlayout *dd) {
    uint64_t h = 1469598103934665603ULL;
#define MIX(x) h = (h ^ (uint64_t)(x)) * 1099511628211ULL
    MIX(d->ta); MIX(d->tb); MIX(d->epi); MIX(d->aux_ld);
    MIX(a->type); MIX(a->rows); MIX(a->cols); MIX(a->ld); MIX(a->batch); MIX(a->stride);
    MIX(b->type); MIX(b->rows); MIX(b->cols); MIX(b->ld); MIX(b->batch); MIX(b->stride);
    MIX(dd->type); MIX(dd->rows); MIX(dd->cols); MIX(dd->ld); MIX(dd->batch); MIX(dd->stride);
#undef MIX
    return h;
}

/* an epilogue refused by MOCK_LT_NO_*_EPILOGUE: NOT_SUPPORTED, or INVALID_VALUE when it is "invalid" */
static cublasStatus_t refused(const char *env) {
    const char *v = getenv(env);
    return v && strcmp(v, "invalid") == 0 ? CUBLAS_STATUS_INVALID_VALUE : CUBLAS_STATUS_NOT_SUPPORTED;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t op, cublasLtMatrixLayout_t A,
                                              cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                                              cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t pref, int req,
                                              cublasLtMatmulHeuristicResult_t res[], int *count) {
    const char *fn = "cublasLtMatmulAlgoGetHeuristic";
    if (!h || h->magic != MAGIC_H) FAIL(CUBLAS_STATUS_NOT_INITIALIZED, "bad handle");
    const mpref *p = (const mpref *)pref;
    if (!p || p->magic != MAGIC_P) FAIL(CUBLAS_STATUS_INVALID_VALUE, "bad preference");
    if (req < 1 || !res || !count) FAIL(CUBLAS_STATUS_INVALID_VALUE, "requestedAlgoCount %d", req);
    const mdesc *d = (const mdesc *)op;
    int m, n, k;
    cublasStatus_t st = validate(fn, d, L_(A), L_(B), L_(C), L_(D), &m, &n, &k);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    for (int i = 0; i < 4; i++)
        if (p->al[i] == 0 || (p->al[i] & (p->al[i] - 1)))
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "min alignment %u is not a power of two", p->al[i]);
    *count = 0;
    if (has_bias(d->epi) && getenv("MOCK_LT_NO_BIAS_EPILOGUE")) return refused("MOCK_LT_NO_BIAS_EPILOGUE");
    /* cuBLASLt: the aux ld must be divisible by 8 */
    if (has_aux(d->epi) && d->aux_ld % 8) return CUBLAS_STATUS_NOT_SUPPORTED;
    if (has_aux(d->epi) && getenv("MOCK_LT_NO_GELU_EPILOGUE")) return refused("MOCK_LT_NO_GELU_EPILOGUE");
    if (d->epi == CUBLASLT_EPILOGUE_BGRADA && getenv("MOCK_LT_NO_BGRAD_EPILOGUE"))
        return refused("MOCK_LT_NO_BGRAD_EPILOGUE");
    if (L_(A)->type == CUDA_R_16BF && getenv("MOCK_LT_NO_BF16")) return CUBLAS_STATUS_SUCCESS; /* found none */
    memset(&res[0], 0, sizeof res[0]);
    uint64_t *ad = res[0].algo.data;
    ad[0] = MAGIC_A;
    ad[1] = shape_hash(d, L_(A), L_(B), L_(D));
    for (int i = 0; i < 4; i++) ad[2 + i] = p->al[i];
    res[0].workspaceSize = 0;
    res[0].state = CUBLAS_STATUS_SUCCESS;
    res[0].wavesCount = 1.0f;
    *count = 1;
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- the product ---- */

typedef struct job {
    mdesc d;
    mlayout a, b, c, dd;
    const void *A, *B;
    const void *C;
    void *D;
    float alpha, beta;
    int m, n, k;
} job;

static inline double ld_elem(const void *p, int type, int64_t i) {
    if (type == CUDA_R_32F) return ((const float *)p)[i];
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16; /* bf16: the top half of a float */
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline void st_elem(void *p, int type, int64_t i, double v) {
    const float f = (float)v;
    if (type == CUDA_R_32F) {
        ((float *)p)[i] = f;
        return;
    }
    uint32_t u;
    memcpy(&u, &f, 4);
    ((uint16_t *)p)[i] = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40u)
                                                        : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* the tanh GELU and its derivative, as kernels/elementwise.cu computes them (in double here) */
static double gelu(double x) {
    const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return 0.5 * x * (1.0 + tanh(u));
}
static double dgelu(double x) {
    const double k = 0.7978845608028654, u = k * (x + 0.044715 * x * x * x), t = tanh(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

static void run_job(void *arg) {
    job *j = arg;
    const int m = j->m, n = j->n, k = j->k;
    double *oa = malloc(sizeof(double) * (size_t)m * (k ? k : 1)); /* op(A) row-major m x k */
    double *ob = malloc(sizeof(double) * (size_t)n * (k ? k : 1)); /* op(B) column c contiguous: n x k */
    for (int bt = 0; bt < j->dd.batch; bt++) {
        const char *A = (const char *)j->A + (size_t)bt * j->a.stride * tsize(j->a.type);
        if (j->d.epi == CUBLASLT_EPILOGUE_BGRADA) /* batch 1: op(A)'s rows summed over k (read below) */
            for (int i = 0; i < m; i++) {
                double g = 0;
                for (int l = 0; l < k; l++)
                    g += j->d.ta == CUBLAS_OP_N ? ld_elem(A, j->a.type, i + (int64_t)l * j->a.ld)
                                                : ld_elem(A, j->a.type, l + (int64_t)i * j->a.ld);
                st_elem((void *)j->d.bias, j->dd.type, i, g);
            }
        const char *B = (const char *)j->B + (size_t)bt * j->b.stride * tsize(j->b.type);
        const char *C = (const char *)j->C + (size_t)bt * j->c.stride * tsize(j->c.type);
        char *D = (char *)j->D + (size_t)bt * j->dd.stride * tsize(j->dd.type);
        for (int i = 0; i < m; i++)
            for (int l = 0; l < k; l++)
                oa[(size_t)i * k + l] = j->d.ta == CUBLAS_OP_N ? ld_elem(A, j->a.type, i + (int64_t)l * j->a.ld)
                                                               : ld_elem(A, j->a.type, l + (int64_t)i * j->a.ld);
        for (int c = 0; c < n; c++)
            for (int l = 0; l < k; l++)
                ob[(size_t)c * k + l] = j->d.tb == CUBLAS_OP_N ? ld_elem(B, j->b.type, l + (int64_t)c * j->b.ld)
                                                               : ld_elem(B, j->b.type, c + (int64_t)l * j->b.ld);
        for (int c = 0; c < n; c++)
            for (int i = 0; i < m; i++) {
                const double *x = oa + (size_t)i * k, *y = ob + (size_t)c * k;
                double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                int l = 0;
                for (; l + 4 <= k; l += 4) {
                    s0 += x[l] * y[l];
                    s1 += x[l + 1] * y[l + 1];
                    s2 += x[l + 2] * y[l + 2];
                    s3 += x[l + 3] * y[l + 3];
                }
                for (; l < k; l++) s0 += x[l] * y[l];
                double v = (double)j->alpha * ((s0 + s1) + (s2 + s3));
                if (j->beta != 0.0f) /* beta 0: C is not read */
                    v += (double)j->beta * ld_elem(C, j->c.type, i + (int64_t)c * j->c.ld);
                if (has_bias(j->d.epi)) v += ld_elem(j->d.bias, j->dd.type, i); /* one for all batches */
                const int64_t ax = i + (int64_t)c * j->d.aux_ld;
                if (j->d.epi == CUBLASLT_EPILOGUE_GELU_AUX || j->d.epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                    v = (float)v; /* the fp32 accumulator, GELU'd before any rounding to D's type */
                    st_elem(j->d.aux, j->dd.type, ax, v);
                    v = gelu(v);
                } else if (j->d.epi == CUBLASLT_EPILOGUE_DGELU) {
                    v = (float)v * dgelu(ld_elem(j->d.aux, j->dd.type, ax));
                }
                st_elem(D, j->dd.type, i + (int64_t)c * j->dd.ld, v);
            }
    }
    free(oa);
    free(ob);
    free(j);
}

/* bytes spanned by a layout: up to the last element of the last batch */
static size_t extent(const mlayout *l) {
    if (!l->rows || !l->cols) return 0;
    uint64_t last = (uint64_t)(l->batch - 1) * (uint64_t)l->stride + (l->cols - 1) * (uint64_t)l->ld + l->rows;
    return (size_t)last * tsize(l->type);
}
static unsigned palign(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && a % al) al /= 2;
    return al;
}
static int overlap(const void *p, size_t pn, const void *q, size_t qn) {
    const char *a = p, *b = q;
    return pn && qn && a < b + qn && b < a + pn;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t op, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t Ad, const void *B, cublasLtMatrixLayout_t Bd, const void *beta,
                              const void *C, cublasLtMatrixLayout_t Cd, void *D, cublasLtMatrixLayout_t Dd,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsn, cudaStream_t s) {
    const char *fn = "cublasLtMatmul";
    if (!h || h->magic != MAGIC_H) FAIL(CUBLAS_STATUS_NOT_INITIALIZED, "bad handle");
    const mdesc *d = (const mdesc *)op;
    int m, n, k;
    cublasStatus_t st = validate(fn, d, L_(Ad), L_(Bd), L_(Cd), L_(Dd), &m, &n, &k);
    if (st != CUBLAS_STATUS_SUCCESS) return st;
    const mlayout *a = L_(Ad), *b = L_(Bd), *c = L_(Cd), *dd = L_(Dd);
    if (!alpha || !beta) FAIL(CUBLAS_STATUS_INVALID_VALUE, "NULL alpha/beta");
    if (!algo) FAIL(CUBLAS_STATUS_NOT_SUPPORTED, "algo NULL: the mock needs an algo from the heuristic");
    if (algo->data[0] != MAGIC_A) FAIL(CUBLAS_STATUS_INVALID_VALUE, "algo not from cublasLtMatmulAlgoGetHeuristic");
    if (algo->data[1] != shape_hash(d, a, b, dd))
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "algo found for other descriptors (shape, transposes or epilogue changed)");
    const void *ptr[4] = {A, B, C, D};
    const mlayout *ls[4] = {a, b, c, dd};
    const char *nm = "ABCD";
    char what[96];
    for (int i = 0; i < 4; i++) {
        snprintf(what, sizeof what, "cuBLASLt matrix %c (%llux%llu ld %lld, batch %d stride %lld)", nm[i],
                 (unsigned long long)ls[i]->rows, (unsigned long long)ls[i]->cols, (long long)ls[i]->ld, ls[i]->batch,
                 (long long)ls[i]->stride);
        if (mock_check_dev_range(ptr[i], extent(ls[i]), what)) return CUBLAS_STATUS_INVALID_VALUE;
        /* every product of a batch starts stride elements after the last: as aligned as the
         * first only when the stride's bytes are */
        unsigned al = palign(ptr[i]), sal = palign((const void *)(uintptr_t)(ls[i]->stride * tsize(ls[i]->type)));
        if (ls[i]->batch > 1 && sal < al) al = sal;
        if (al < algo->data[2 + i])
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "%c is %u-byte aligned (batch %d, stride %lld) but the heuristic was told "
                 "at least %llu", nm[i], al, ls[i]->batch, (long long)ls[i]->stride,
                 (unsigned long long)algo->data[2 + i]);
        if (palign(ptr[i]) < tsize(ls[i]->type)) FAIL(CUBLAS_STATUS_INVALID_VALUE, "%c is not element-aligned", nm[i]);
    }
    if (C != D && overlap(C, extent(c), D, extent(dd)))
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "C and D overlap without being the same matrix");
    if (C == D && (c->ld != dd->ld || c->stride != dd->stride || c->type != dd->type))
        FAIL(CUBLAS_STATUS_INVALID_VALUE, "in-place C == D with different layouts");
    if (overlap(A, extent(a), D, extent(dd))) FAIL(CUBLAS_STATUS_INVALID_VALUE, "D overlaps A (aliases an input)");
    if (overlap(B, extent(b), D, extent(dd))) FAIL(CUBLAS_STATUS_INVALID_VALUE, "D overlaps B (aliases an input)");
    if (has_aux(d->epi)) {
        const size_t aux_n = ((size_t)(n - 1) * (size_t)d->aux_ld + (size_t)m) * tsize(dd->type);
        snprintf(what, sizeof what, "cuBLASLt epilogue aux matrix (%dx%d ld %lld %s)", m, n, (long long)d->aux_ld,
                 tname(dd->type));
        if (mock_check_dev_range(d->aux, aux_n, what)) return CUBLAS_STATUS_INVALID_VALUE;
        if (palign(d->aux) < 16) FAIL(CUBLAS_STATUS_INVALID_VALUE, "aux matrix %p under 16-byte alignment", d->aux);
        if (overlap(d->aux, aux_n, D, extent(dd))) FAIL(CUBLAS_STATUS_INVALID_VALUE, "the aux matrix overlaps D");
        if (overlap(d->aux, aux_n, A, extent(a)) || overlap(d->aux, aux_n, B, extent(b)))
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "the aux matrix overlaps A or B");
    }
    if (d->epi == CUBLASLT_EPILOGUE_BGRADA) { /* the bias gradient it writes */
        snprintf(what, sizeof what, "cuBLASLt bias gradient vector (%d %s)", m, tname(dd->type));
        const size_t bn = (size_t)m * tsize(dd->type);
        if (mock_check_dev_range(d->bias, bn, what)) return CUBLAS_STATUS_INVALID_VALUE;
        if (palign(d->bias) < 16) FAIL(CUBLAS_STATUS_INVALID_VALUE, "bias gradient %p under 16-byte alignment", d->bias);
        if (overlap(d->bias, bn, D, extent(dd)) || overlap(d->bias, bn, A, extent(a)) || overlap(d->bias, bn, B, extent(b)))
            FAIL(CUBLAS_STATUS_INVALID_VALUE, "the bias gradient overlaps A, B or D");
    }
    if (has_bias(d->epi)) {
        snprintf(what, sizeof what, "cuBLASLt bias vector (%d %s)", m, tname(dd->type));
        if (mock_check_dev_range(d->bias, (size_t)m * tsize(dd->type), what)) return CUBLAS_STATUS_INVALID_VALUE;
        if (palign(d->bias) < 16)
            FAIL(CUBLAS_STATUS_INVALID_VALUE,
                 "bias epilogue with a %u-byte aligned bias vector %p (m %d n %d k %d): the mock requires 16 (fused "
                 "epilogues load it vectorised)", palign(d->bias), d->bias, m, n, k);
    }
    if (wsn > 0 && mock_check_dev_range(ws, wsn, "cuBLASLt workspace")) return CUBLAS_STATUS_INVALID_VALUE;
    job *j = malloc(sizeof *j);
    *j = (job){.d = *d, .a = *a, .b = *b, .c = *c, .dd = *dd, .A = A, .B = B, .C = C, .D = D, .m = m, .n = n, .k = k};
    memcpy(&j->alpha, alpha, sizeof(float)); /* host pointer mode: read now */
    memcpy(&j->beta, beta, sizeof(float));
    if (getenv("MOCK_LT_TRACE"))
        fprintf(stderr, "MOCK LT: m %d n %d k %d op%c%c %s ld %lld %lld %lld batch %d strides %lld %lld %lld alpha %g "
                "beta %g%s%s\n", m, n, k, d->ta == CUBLAS_OP_N ? 'N' : 'T', d->tb == CUBLAS_OP_N ? 'N' : 'T',
                tname(a->type), (long long)a->ld, (long long)b->ld, (long long)dd->ld, dd->batch, (long long)a->stride,
                (long long)b->stride, (long long)dd->stride, j->alpha, j->beta, has_bias(d->epi) ? " +bias" : "",
                d->epi == CUBLASLT_EPILOGUE_DGELU ? " DGELU" : has_aux(d->epi) ? " GELU"
                : d->epi == CUBLASLT_EPILOGUE_BGRADA ? " BGRADA" : "");
    mock_enqueue_fn((void *)s, "cublasLtMatmul", run_job, j);
    return CUBLAS_STATUS_SUCCESS;
}
