/* ops_cuda.c — host side of the CUDA backend. Today: library versions; the op table for
 * GPU training arrives with the CUDA kernels (kernels/).
 *
 * cuBLASLt, cuDNN and NCCL are not linked into dtrain: loading cuBLASLt alone costs every
 * process about 150 MB of resident memory, GPU or not (docs/PERFORMANCE.md). Their versions
 * are read through dlopen, only when asked (--version); their headers give the versions
 * dtrain was built with. */
#include "dtrain/cuda.h"

#include <dlfcn.h>
#include <stdio.h>
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

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

static int missing(char *buf, size_t n, size_t *k, const char *name, const char *soname) {
    if (*k < n)
        *k += (size_t)snprintf(buf + *k, n - *k, "  %-9s %s not found  MISMATCH: install it, or rebuild dtrain\n", name,
                               soname);
    return 1;
}

int dt_cuda_versions(char *buf, size_t n) {
    int rt = 0, drv = 0, nccl = 0, bad = 0;
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

    int ma, mi, pa, bma, bmi, bpa;
    char soname[64];
    snprintf(soname, sizeof soname, "libcublasLt.so.%d", CUBLAS_VER_MAJOR);
    long lt = lib_version(soname, "cublasLtGetVersion", 0);
    if (lt < 0) return bad + missing(buf, n, &k, "cuBLASLt", soname);
    mmp(lt, 0, &ma, &mi, &pa);
    mmp(CUBLAS_VERSION, 0, &bma, &bmi, &bpa);
    snprintf(now, sizeof now, "%d.%d.%d", ma, mi, pa);
    snprintf(built, sizeof built, "%d.%d.%d", bma, bmi, bpa);
    bad += line(buf, n, &k, "cuBLASLt", now, built, ma != bma ? "another major version of cuBLAS" : NULL);

    snprintf(soname, sizeof soname, "libcudnn.so.%d", CUDNN_MAJOR);
    long dnn = lib_version(soname, "cudnnGetVersion", 0);
    if (dnn < 0) return bad + missing(buf, n, &k, "cuDNN", soname);
    mmp(dnn, dnn < 90000, &ma, &mi, &pa);
    mmp(CUDNN_VERSION, CUDNN_VERSION < 90000, &bma, &bmi, &bpa);
    snprintf(now, sizeof now, "%d.%d.%d", ma, mi, pa);
    snprintf(built, sizeof built, "%d.%d.%d", bma, bmi, bpa);
    bad += line(buf, n, &k, "cuDNN", now, built,
                ma != bma ? "another major version of cuDNN" : mi < bmi ? "an older cuDNN than dtrain was built with" : NULL);

    snprintf(soname, sizeof soname, "libnccl.so.%d", NCCL_MAJOR);
    long nv = lib_version(soname, "ncclGetVersion", 1);
    if (nv < 0) return bad + missing(buf, n, &k, "NCCL", soname);
    nccl = (int)nv;
    mmp(nccl, 0, &ma, &mi, &pa);
    mmp(NCCL_VERSION_CODE, 0, &bma, &bmi, &bpa);
    snprintf(now, sizeof now, "%d.%d.%d", ma, mi, pa);
    snprintf(built, sizeof built, "%d.%d.%d", bma, bmi, bpa);
    bad += line(buf, n, &k, "NCCL", now, built,
                ma != bma || mi < bmi ? "an older or other NCCL than dtrain was built with" : NULL);
    return bad;
}
