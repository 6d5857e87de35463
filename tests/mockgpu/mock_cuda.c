/* mock_cuda.c — libmockcuda.so: the CUDA runtime calls dtrain makes, on the CPU, and the
 * executor for the kernels of kernels/ compiled as host C++ (emu/cuda_runtime.h); also the
 * runtime under the NCCL stand-in (mock_nccl.c) for tests/test_comm_nccl.c and
 * tests/mockgpu/test_nccl_ranks.c. MOCK_DEVICE_COUNT simulated devices (default 1, at most
 * 64; H200-like properties), of which each process uses one: dtrain forks a worker per GPU,
 * and a process's device memory is its own, whichever device is current; x86-64 Linux only
 * (the fiber switch is assembly).
 *
 * Modelled, and checked:
 *   - streams: each is a worker thread that runs its queue in order (copies, memsets, kernels,
 *     library work, host functions, event records and waits), so host/stream and
 *     stream/stream ordering is real: a missing synchronisation shows up as a wrong result or
 *     a race. cudaStreamWaitEvent waits for the event's latest record at the time of the call
 *     (none yet: no wait); cudaEventQuery says whether its stream got there, and
 *     cudaEventElapsedTime the host clock's time between two records' completions (events
 *     made with cudaEventDisableTiming refuse, as in CUDA). A host function
 *     (cudaLaunchHostFunc) that queues or waits for stream work is an error (CUDA forbids
 *     it), and so is the use of a destroyed stream or event.
 *   - memory: device allocations are exact-size host memory (an ASan build sees a one-past-
 *     the-end access), filled with garbage on cudaMalloc and on cudaFree (reads of
 *     uninitialised or freed memory give huge values). Copies and memsets must lie inside one
 *     allocation and match their cudaMemcpyKind; kernel pointer arguments must be device
 *     memory (a host pointer is what a GPU would fault on). Managed memory (cudaMallocManaged)
 *     is such an allocation that host and device may both use: it passes as either side of a
 *     copy. cudaPointerGetAttributes tells device, pinned (cudaMallocHost), managed and
 *     unregistered (pageable) memory apart, as CUDA 11+ does.
 *   - kernels: launch configurations are validated as CUDA does (cudaErrorInvalidConfiguration
 *     from cudaGetLastError). Blocks run one after another; the threads of a block are fibers,
 *     each run until it reaches a barrier, so __syncthreads and warp shuffles are real
 *     barriers: threads waiting at different __syncthreads (divergent barriers), deadlocks and
 *     full-mask shuffles with missing lanes are errors. A kernel error is sticky (every later
 *     call fails with cudaErrorLaunchFailure), as on a GPU.
 *   - devices: cudaGetDeviceCount reports MOCK_DEVICE_COUNT; cudaSetDevice accepts 0 to count-1
 *     and makes it current for the calling host thread (default 0), as CUDA does; allocations
 *     remember the device current when they were made (cudaPointerGetAttributes says it).
 *   - MOCK_ORDER=rev runs the blocks of each grid and the threads of each block in reverse
 *     order: results that depend on the order of blocks or threads change.
 * Every problem is printed as "MOCK ERROR: ..." on stderr and makes the process exit 1.
 *
 * Deliberately not modelled: real parallelism inside a kernel (blocks are sequential, and
 * threads only interleave at barriers, so a race between barriers is seen only through
 * MOCK_ORDER=rev); lockstep execution of a warp (code that relies on it without a shuffle or
 * barrier is not checked); the memory model, atomics (but an unsigned atomicAdd, trivially
 * atomic here) and cooperative launches (kernels using them do not compile against emu/); dynamic shared memory (a launch asking for it is
 * reported); the legacy default stream's implicit synchronisation with other streams;
 * a GPU's timing (work takes as long as its emulation on the host); several devices used by
 * one process (streams, kernels and copies do not check which device is current; there is no
 * peer access); managed memory's page migration (a host access while a kernel uses it is not
 * checked); a host that dereferences a device pointer (both are host memory here). */
#define _GNU_SOURCE
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#include <sanitizer/asan_interface.h>
#define MOCK_ASAN 1
#else
#define MOCK_ASAN 0
#endif

#include "mock_api.h"

/* ---------------------------------------------------------------- errors */

static int mock_errors;

void mock_report(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "MOCK ERROR: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    __atomic_add_fetch(&mock_errors, 1, __ATOMIC_SEQ_CST);
    if (getenv("MOCK_ABORT")) abort();
}

static void summary(void) {
    if (__atomic_load_n(&mock_errors, __ATOMIC_SEQ_CST)) {
        fprintf(stderr, "MOCK: %d error(s) reported above: exiting 1\n", mock_errors);
        fflush(NULL);
        _exit(1);
    }
}
__attribute__((constructor)) static void mock_init(void) { atexit(summary); }

static __thread cudaError_t last_err;
static volatile cudaError_t sticky_err; /* a kernel fault: every later call fails */
static cudaError_t ret(cudaError_t e) {
    if (e != cudaSuccess) last_err = e;
    return e;
}
static void set_sticky(cudaError_t e) { __sync_bool_compare_and_swap(&sticky_err, cudaSuccess, e); }

/* ---------------------------------------------------------------- allocations */

typedef struct reg { char *p; size_t n; int type, dev; struct reg *next; } reg;
static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static reg *regs;
static size_t dev_in_use, dev_peak;

/* MOCK_DEVICE_PEAK_FILE=PATH: the most device memory this process has had allocated at once, in
 * bytes, written to PATH.<pid> each time it grows (a forked worker ends with _exit: no atexit),
 * for a test to hold against --dry-run's estimate */
static void note_peak(size_t in_use) {
    const char *path = getenv("MOCK_DEVICE_PEAK_FILE");
    if (!path || in_use <= dev_peak) return;
    dev_peak = in_use;
    char name[4096];
    snprintf(name, sizeof name, "%s.%ld", path, (long)getpid());
    FILE *f = fopen(name, "w");
    if (f) {
        fprintf(f, "%zu\n", in_use);
        fclose(f);
    }
}

/* The allocation holding p: 1 and its base/size/type/device, or 0 (not CUDA memory). */
static int find_dev(const void *p, void **base, size_t *size, int *type, int *dev) {
    int found = 0;
    pthread_mutex_lock(&reg_mu);
    for (reg *r = regs; r; r = r->next)
        if ((const char *)p >= r->p && (const char *)p < r->p + (r->n ? r->n : 1)) {
            if (base) *base = r->p;
            if (size) *size = r->n;
            if (type) *type = r->type;
            if (dev) *dev = r->dev;
            found = 1;
            break;
        }
    pthread_mutex_unlock(&reg_mu);
    return found;
}
static int find(const void *p, void **base, size_t *size, int *type) { return find_dev(p, base, size, type, NULL); }

int mock_check_dev_range(const void *p, size_t bytes, const char *what) {
    void *base;
    size_t size;
    int type;
    if (!p) {
        mock_report("%s: NULL device pointer", what);
        return 1;
    }
    if (!find(p, &base, &size, &type)) {
        mock_report("%s: %p is not device memory (a host pointer?)", what, p);
        return 1;
    }
    if (type == cudaMemoryTypeHost) { /* device and managed memory are what a kernel may use */
        mock_report("%s: %p is pinned host memory, not device memory", what, p);
        return 1;
    }
    size_t off = (size_t)((const char *)p - (const char *)base);
    if (off + bytes > size) {
        mock_report("%s: %zu bytes at offset %zu overrun the %zu-byte allocation by %zu bytes", what, bytes, off, size,
                    off + bytes - size);
        return 1;
    }
    return 0;
}

/* the device's memory: 141 GiB, or MOCK_DEVICE_MEM_MB (to run out of it on purpose) */
static size_t device_total(void) {
    const char *mb = getenv("MOCK_DEVICE_MEM_MB");
    return mb && atol(mb) > 0 ? (size_t)atol(mb) << 20 : (size_t)141 << 30;
}

/* Allocations (cudaMalloc, cudaMallocHost, cudaMallocManaged) and frees (cudaFree,
 * cudaFreeHost) so far, for the profiler's range; after the first cudaProfilerStart each
 * allocation is said on stderr ("MOCK ALLOCATION: ..."): dtrain with logging.profile_step 1
 * opens the range just before step 1, and no training step may allocate (nor free: cudaFree
 * waits for the whole device, NCCL's collectives too) */
static unsigned long n_allocs, n_frees;
static int prof_started;
/* the calling host thread's current device (cudaSetDevice), as in CUDA: each thread starts on 0 */
static __thread int cur_dev;

static cudaError_t alloc(void **p, size_t n, int type) {
    *p = NULL;
    if (sticky_err) return ret(sticky_err);
    pthread_mutex_lock(&reg_mu);
    const int full = type == cudaMemoryTypeDevice && dev_in_use + n > device_total();
    pthread_mutex_unlock(&reg_mu);
    if (full) return ret(cudaErrorMemoryAllocation); /* not sticky, as in CUDA */
    if (posix_memalign(p, 256, n ? n : 1) != 0) return ret(cudaErrorMemoryAllocation);
    memset(*p, 0x5a, n); /* garbage, like fresh device memory: 0x5a5a5a5a is 1.5e16 as a float */
    reg *r = malloc(sizeof *r);
    *r = (reg){*p, n, type, cur_dev, NULL};
    pthread_mutex_lock(&reg_mu);
    r->next = regs;
    regs = r;
    if (type == cudaMemoryTypeDevice) {
        dev_in_use += n;
        note_peak(dev_in_use);
    }
    n_allocs++;
    const int said = prof_started;
    pthread_mutex_unlock(&reg_mu);
    if (said)
        fprintf(stderr, "MOCK ALLOCATION: %s of %zu bytes after the first cudaProfilerStart\n",
                type == cudaMemoryTypeHost ? "cudaMallocHost" : type == cudaMemoryTypeManaged ? "cudaMallocManaged"
                                                                                               : "cudaMalloc", n);
    return cudaSuccess;
}

/* ---------------------------------------------------------------- streams */

enum { OP_COPY, OP_SET, OP_FN, OP_HOST_FN, OP_RECORD, OP_WAIT };
/* t: when a stream passed its latest completed record (CLOCK_MONOTONIC, s), for cudaEventElapsedTime */
typedef struct mevent { pthread_mutex_t mu; pthread_cond_t cv; uint64_t rec, done; int destroyed, timing; double t; } mevent;
typedef struct op {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    int v;
    void (*fn)(void *);
    void *arg;
    void *staging; /* freed after the op (pageable host-to-device copies) */
    mevent *ev;
    uint64_t gen;
    struct op *next;
} op;
typedef struct mstream { pthread_t th; pthread_mutex_t mu; pthread_cond_t cv; op *head, *tail; int destroyed; } mstream;

static mstream *streams[4096];
static int nstreams;
static mstream *legacy;
static __thread const char *in_host_fn; /* a stream thread inside a cudaLaunchHostFunc function */

static void ev_complete(mevent *e, uint64_t gen) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    pthread_mutex_lock(&e->mu);
    if (gen > e->done) {
        e->done = gen;
        e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void *worker(void *arg) {
    mstream *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head) pthread_cond_wait(&s->cv, &s->mu);
        op *o = s->head;
        pthread_mutex_unlock(&s->mu);
        switch (o->kind) {
        case OP_COPY: if (!sticky_err) memmove(o->dst, o->src, o->n); break;
        case OP_SET: if (!sticky_err) memset(o->dst, o->v, o->n); break;
        case OP_FN: o->fn(o->arg); break;
        case OP_HOST_FN:
            in_host_fn = "a host function (cudaLaunchHostFunc)";
            o->fn(o->arg);
            in_host_fn = NULL;
            break;
        case OP_RECORD: ev_complete(o->ev, o->gen); break;
        case OP_WAIT:
            pthread_mutex_lock(&o->ev->mu);
            while (o->ev->done < o->gen) pthread_cond_wait(&o->ev->cv, &o->ev->mu);
            pthread_mutex_unlock(&o->ev->mu);
            break;
        }
        free(o->staging);
        pthread_mutex_lock(&s->mu);
        s->head = o->next; /* dequeued only when done: drain() waits for an empty queue */
        if (!s->head) s->tail = NULL;
        free(o);
        pthread_cond_broadcast(&s->cv);
    }
    return NULL;
}

static mstream *stream_new(void) {
    mstream *s = calloc(1, sizeof *s);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 8u << 20);
    pthread_create(&s->th, &at, worker, s);
    pthread_attr_destroy(&at);
    pthread_mutex_lock(&reg_mu);
    if (nstreams == (int)(sizeof streams / sizeof streams[0])) {
        fprintf(stderr, "MOCK: more than %d streams\n", nstreams);
        abort();
    }
    streams[nstreams++] = s;
    pthread_mutex_unlock(&reg_mu);
    return s;
}

static pthread_mutex_t legacy_mu = PTHREAD_MUTEX_INITIALIZER;
static mstream *S(cudaStream_t st) {
    if (st == NULL || st == cudaStreamLegacy || st == cudaStreamPerThread) {
        pthread_mutex_lock(&legacy_mu);
        if (!legacy) legacy = stream_new();
        pthread_mutex_unlock(&legacy_mu);
        return legacy;
    }
    mstream *s = (mstream *)st;
    if (s->destroyed) mock_report("use of a destroyed stream %p", (void *)s);
    return s;
}

/* CUDA forbids CUDA calls in a host function: one that queues work or waits for a stream
 * may deadlock (the stream waits for the function, the function for the stream) */
static void host_fn_check(const char *what) {
    if (in_host_fn) mock_report("%s inside %s: CUDA calls are not allowed there", what, in_host_fn);
}

static void push(mstream *s, op o) {
    host_fn_check("stream work queued");
    op *p = malloc(sizeof *p);
    *p = o;
    p->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->tail) s->tail->next = p;
    else s->head = p;
    s->tail = p;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

static void drain(mstream *s) {
    host_fn_check("a wait for a stream");
    pthread_mutex_lock(&s->mu);
    while (s->head) pthread_cond_wait(&s->cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

static void drain_all(void) {
    pthread_mutex_lock(&reg_mu);
    int n = nstreams;
    pthread_mutex_unlock(&reg_mu);
    for (int i = 0; i < n; i++) drain(streams[i]);
}

static unsigned long n_kernels, n_library; /* queued so far (mock_launch_counts) */
/* MOCK_PROFILER_LOG=FILE: every kernel launch and library call inside a profiler range
 * (cudaProfilerStart/Stop), one a line, appended to FILE ("kernel NAME GX GY GZ BX BY BZ",
 * "library NAME"): what gpu-check's rehearsal (gpucheck/ncu) makes ncu's report from */
static int prof_on;
static FILE *prof_log;
static pthread_mutex_t prof_mu = PTHREAD_MUTEX_INITIALIZER;
__attribute__((format(printf, 1, 2))) static void prof_note(const char *fmt, ...) {
    if (!__atomic_load_n(&prof_on, __ATOMIC_SEQ_CST) || !prof_log) return;
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&prof_mu);
    vfprintf(prof_log, fmt, ap);
    pthread_mutex_unlock(&prof_mu);
    va_end(ap);
}

size_t mock_device_in_use(void) {
    pthread_mutex_lock(&reg_mu);
    const size_t n = dev_in_use;
    pthread_mutex_unlock(&reg_mu);
    return n;
}

void mock_launch_counts(unsigned long *kernels, unsigned long *library) {
    *kernels = __atomic_load_n(&n_kernels, __ATOMIC_SEQ_CST);
    *library = __atomic_load_n(&n_library, __ATOMIC_SEQ_CST);
}

void mock_enqueue_fn(void *st, const char *name, void (*fn)(void *), void *arg) {
    __atomic_add_fetch(&n_library, 1, __ATOMIC_SEQ_CST);
    prof_note("library %s\n", name);
    push(S(st), (op){.kind = OP_FN, .fn = fn, .arg = arg});
}

/* ---------------------------------------------------------------- runtime API */

/* CUDA does not survive fork: a child whose parent had initialised CUDA gets
 * cudaErrorInitializationError from its first call (seen on an H200: `dtrain doctor --device
 * cuda`, whose parent asked cudaDriverGetVersion before forking its workers). CUDA does not
 * document which calls initialise, so here every call but cudaRuntimeGetVersion (a constant)
 * does: the process that made the first one owns CUDA, and the device calls below fail in any
 * other process. */
static pid_t cuda_owner;
static cudaError_t owned(void) {
    const pid_t me = getpid();
    pid_t was = 0;
    if (__atomic_compare_exchange_n(&cuda_owner, &was, me, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST) || was == me)
        return cudaSuccess;
    mock_report("CUDA used in process %ld, forked from process %ld after that had initialised CUDA (a GPU answers "
                "cudaErrorInitializationError)", (long)me, (long)was);
    return ret(cudaErrorInitializationError);
}

/* MOCK_DEVICE_COUNT: how many devices the process sees (default 1, at most MAX_DEVICES), read
 * once; a value that is not such a number is reported, and 1 is used */
#define MAX_DEVICES 64
static int device_count(void) {
    static int count; /* 0: not read yet */
    int n = __atomic_load_n(&count, __ATOMIC_ACQUIRE);
    if (n) return n;
    const char *v = getenv("MOCK_DEVICE_COUNT");
    n = 1;
    if (v) {
        char *end;
        errno = 0;
        const long k = strtol(v, &end, 10);
        if (end != v && !*end && !errno && k >= 1 && k <= MAX_DEVICES) n = (int)k;
        else mock_report("MOCK_DEVICE_COUNT=\"%s\": expected a number of devices from 1 to %d", v, MAX_DEVICES);
    }
    int was = 0; /* one report when threads race: the first reader's value stays */
    if (!__atomic_compare_exchange_n(&count, &was, n, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) n = was;
    return n;
}
static int valid_device(int d) { return d >= 0 && d < device_count(); }

cudaError_t cudaGetDeviceCount(int *n) {
    const cudaError_t e = owned();
    if (e != cudaSuccess) return e;
    *n = device_count();
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) {
    const cudaError_t e = owned();
    if (e != cudaSuccess) return e;
    if (!valid_device(d)) return ret(cudaErrorInvalidDevice);
    cur_dev = d;
    return cudaSuccess;
}
cudaError_t cudaGetDevice(int *d) {
    *d = cur_dev;
    return cudaSuccess;
}
cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp *p, int d) {
    if (!valid_device(d)) return ret(cudaErrorInvalidDevice);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "Mock H200 (CPU emulation)");
    p->totalGlobalMem = device_total();
    p->sharedMemPerBlock = 48 << 10;
    p->warpSize = 32;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 0x7fffffff;
    p->maxGridSize[1] = p->maxGridSize[2] = 65535;
    p->major = 9;
    p->minor = 0;
    p->multiProcessorCount = 132;
    /* device 0 is 00000000:3B:00.0, the GPU run-test.sh's fake NVML describes; device d is on bus 0x3B + d */
    p->pciDomainID = 0;
    p->pciBusID = 0x3B + d;
    p->pciDeviceID = 0;
    return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int *v) {
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaDriverGetVersion(int *v) {
    const cudaError_t e = owned();
    if (e != cudaSuccess) return e;
    *v = CUDART_VERSION;
    return cudaSuccess;
}
cudaError_t cudaGetLastError(void) {
    cudaError_t e = last_err;
    last_err = cudaSuccess;
    return sticky_err ? sticky_err : e;
}
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    default: return "cudaErrorUnknown";
    }
}
const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure (mock: a kernel error, see MOCK ERROR above)";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    default: return "unknown error";
    }
}

cudaError_t cudaMalloc(void **p, size_t n) { return alloc(p, n, cudaMemoryTypeDevice); }
cudaError_t cudaMallocHost(void **p, size_t n) { return alloc(p, n, cudaMemoryTypeHost); }
cudaError_t cudaHostAlloc(void **p, size_t n, unsigned flags) {
    if (flags & ~(unsigned)(cudaHostAllocPortable | cudaHostAllocMapped | cudaHostAllocWriteCombined)) {
        *p = NULL;
        mock_report("cudaHostAlloc: unknown flags %#x", flags);
        return ret(cudaErrorInvalidValue);
    }
    return alloc(p, n, cudaMemoryTypeHost);
}
cudaError_t cudaMallocManaged(void **p, size_t n, unsigned flags) {
    if (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost) {
        *p = NULL;
        mock_report("cudaMallocManaged: flags %#x (cudaMemAttachGlobal or cudaMemAttachHost expected)", flags);
        return ret(cudaErrorInvalidValue);
    }
    if (n == 0) { /* CUDA: cudaErrorInvalidValue for a 0-byte managed allocation */
        *p = NULL;
        return ret(cudaErrorInvalidValue);
    }
    return alloc(p, n, cudaMemoryTypeManaged);
}
static const char *alloc_name(int type) {
    return type == cudaMemoryTypeHost ? "cudaMallocHost" : type == cudaMemoryTypeManaged ? "cudaMallocManaged"
                                                                                          : "cudaMalloc";
}
/* cudaFree: device and managed memory; cudaFreeHost: pinned memory */
static cudaError_t release(void *p, int want_host) {
    if (!p) return cudaSuccess;
    drain_all(); /* cudaFree synchronizes the device */
    pthread_mutex_lock(&reg_mu);
    for (reg **q = &regs; *q; q = &(*q)->next)
        if ((*q)->p == p) {
            reg *r = *q;
            int is_host = r->type == cudaMemoryTypeHost;
            if (is_host != want_host) {
                pthread_mutex_unlock(&reg_mu);
                mock_report("%s of %p allocated with %s", want_host ? "cudaFreeHost" : "cudaFree", p,
                            alloc_name(r->type));
                return ret(cudaErrorInvalidValue);
            }
            *q = r->next;
            if (r->type == cudaMemoryTypeDevice) dev_in_use -= r->n;
            n_frees++;
            memset(r->p, 0x7f, r->n); /* 0x7f7f7f7f = 3.4e38: reads after free show up */
            free(r);
            pthread_mutex_unlock(&reg_mu);
            free(p);
            return cudaSuccess;
        }
    pthread_mutex_unlock(&reg_mu);
    mock_report("%s of unknown pointer %p", want_host ? "cudaFreeHost" : "cudaFree", p);
    return ret(cudaErrorInvalidValue);
}
cudaError_t cudaFree(void *p) { return release(p, 0); }
cudaError_t cudaFreeHost(void *p) { return release(p, 1); }
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    *t = device_total();
    pthread_mutex_lock(&reg_mu);
    *f = *t - dev_in_use;
    pthread_mutex_unlock(&reg_mu);
    return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *p) {
    memset(a, 0, sizeof *a);
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
    int type, dev;
    if (find_dev(p, NULL, NULL, &type, &dev)) { /* one address space: device and host pointers are p */
        a->type = type;
        a->device = dev;
        a->devicePointer = (void *)p;
        if (type != cudaMemoryTypeDevice) a->hostPointer = (void *)p;
    }
    return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    (void)flags; /* no legacy-stream synchronisation to opt out of */
    *s = (cudaStream_t)stream_new();
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (!s) return ret(cudaErrorInvalidValue);
    ((mstream *)s)->destroyed = 1; /* its thread stays: pending work still completes */
    return cudaSuccess;
}
/* Synchronisations: every call that makes the host wait for the device (cudaStreamSynchronize,
 * cudaDeviceSynchronize, cudaEventSynchronize, cudaMemcpy, and a cudaMemcpyAsync into pageable
 * memory, which returns when the copy is done), counted for the profiler's range: a training
 * step should wait once (ops.h check), not once per upload, loss or norm */
static unsigned long n_syncs;
static void count_sync(void) { __atomic_add_fetch(&n_syncs, 1, __ATOMIC_SEQ_CST); }
unsigned long mock_sync_count(void) { return __atomic_load_n(&n_syncs, __ATOMIC_SEQ_CST); }
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    count_sync();
    drain(S(s));
    return sticky_err ? ret(sticky_err) : cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    count_sync();
    drain_all();
    return sticky_err ? ret(sticky_err) : cudaSuccess;
}
/* The range a profiler would record (ops.h profile): said on stderr with the kernel launches
 * and library calls queued inside it, so a test can check that it holds one training step.
 * A start inside a range, or a stop outside one, is an error (the real runtime would not
 * mind; dtrain must not do it). */
static unsigned long prof_kernels, prof_library, prof_allocs, prof_frees, prof_syncs;
static void alloc_counts(unsigned long *allocs, unsigned long *frees) {
    pthread_mutex_lock(&reg_mu);
    *allocs = n_allocs;
    *frees = n_frees;
    pthread_mutex_unlock(&reg_mu);
}
cudaError_t cudaProfilerStart(void) {
    if (prof_on) {
        mock_report("cudaProfilerStart: a range is already open");
        return ret(cudaErrorInvalidValue);
    }
    const char *path = getenv("MOCK_PROFILER_LOG");
    if (path && *path && !prof_log && !(prof_log = fopen(path, "a")))
        mock_report("cudaProfilerStart: cannot open MOCK_PROFILER_LOG %s: %s", path, strerror(errno));
    __atomic_store_n(&prof_on, 1, __ATOMIC_SEQ_CST);
    mock_launch_counts(&prof_kernels, &prof_library);
    alloc_counts(&prof_allocs, &prof_frees);
    prof_syncs = mock_sync_count();
    pthread_mutex_lock(&reg_mu);
    prof_started = 1;
    pthread_mutex_unlock(&reg_mu);
    fprintf(stderr, "MOCK PROFILER: start\n");
    return cudaSuccess;
}
cudaError_t cudaProfilerStop(void) {
    if (!prof_on) {
        mock_report("cudaProfilerStop: no range is open");
        return ret(cudaErrorInvalidValue);
    }
    unsigned long k, l, a, f;
    mock_launch_counts(&k, &l);
    alloc_counts(&a, &f);
    const unsigned long sy = mock_sync_count();
    __atomic_store_n(&prof_on, 0, __ATOMIC_SEQ_CST);
    if (prof_log) {
        pthread_mutex_lock(&prof_mu);
        fflush(prof_log);
        pthread_mutex_unlock(&prof_mu);
    }
    fprintf(stderr, "MOCK PROFILER: stop: %lu kernel launches and %lu library calls in the range; %lu synchronisations; "
            "%lu allocations and %lu frees\n", k - prof_kernels, l - prof_library, sy - prof_syncs, a - prof_allocs,
            f - prof_frees);
    return cudaSuccess;
}
/* fn(arg) on the stream's thread once the work before it is done; later work waits for it */
cudaError_t cudaLaunchHostFunc(cudaStream_t st, cudaHostFn_t fn, void *arg) {
    if (sticky_err) return ret(sticky_err);
    if (!fn) {
        mock_report("cudaLaunchHostFunc: NULL function");
        return ret(cudaErrorInvalidValue);
    }
    push(S(st), (op){.kind = OP_HOST_FN, .fn = fn, .arg = arg});
    return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    mevent *m = calloc(1, sizeof *m);
    m->timing = !(flags & cudaEventDisableTiming);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    *e = (cudaEvent_t)m;
    return cudaSuccess;
}
/* m, or NULL (reported) when it is NULL or was destroyed */
static mevent *EV(cudaEvent_t e, const char *call) {
    mevent *m = (mevent *)e;
    if (!m) mock_report("%s: NULL event", call);
    else if (__atomic_load_n(&m->destroyed, __ATOMIC_SEQ_CST))
        mock_report("%s: use of a destroyed event %p", call, (void *)m);
    else return m;
    return NULL;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    mevent *m = EV(e, "cudaEventDestroy");
    if (!m) return ret(cudaErrorInvalidResourceHandle);
    __atomic_store_n(&m->destroyed, 1, __ATOMIC_SEQ_CST); /* leaked: a stream may still record or wait on it */
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    mevent *m = EV(e, "cudaEventRecord");
    if (!m) return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&m->mu);
    uint64_t g = ++m->rec;
    pthread_mutex_unlock(&m->mu);
    push(S(s), (op){.kind = OP_RECORD, .ev = m, .gen = g});
    return cudaSuccess;
}
/* cudaSuccess once the stream passed the latest record (or none was made), else NotReady, which
 * the real runtime also leaves as the thread's last error (cudaGetLastError clears it; PyTorch's
 * caching allocator had to, pytorch/pytorch#18584): so does this one */
cudaError_t cudaEventQuery(cudaEvent_t e) {
    mevent *m = EV(e, "cudaEventQuery");
    if (!m) return ret(cudaErrorInvalidResourceHandle);
    if (sticky_err) return ret(sticky_err);
    pthread_mutex_lock(&m->mu);
    int done = m->done >= m->rec;
    pthread_mutex_unlock(&m->mu);
    return done ? cudaSuccess : ret(cudaErrorNotReady);
}
/* waits until the stream passed the latest record (or none was made) */
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    mevent *m = EV(e, "cudaEventSynchronize");
    if (!m) return ret(cudaErrorInvalidResourceHandle);
    count_sync();
    host_fn_check("cudaEventSynchronize");
    pthread_mutex_lock(&m->mu);
    const uint64_t g = m->rec; /* the latest record at the time of the call */
    while (m->done < g) pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
    return sticky_err ? ret(sticky_err) : cudaSuccess;
}
/* the time between two completed records, as CUDA: both events made with timing (else
 * cudaErrorInvalidResourceHandle), both recorded (else cudaErrorInvalidResourceHandle) and their
 * latest records completed (else cudaErrorNotReady) */
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
    mevent *a = EV(start, "cudaEventElapsedTime"), *b = EV(end, "cudaEventElapsedTime");
    if (!a || !b) return ret(cudaErrorInvalidResourceHandle);
    if (!ms) {
        mock_report("cudaEventElapsedTime: NULL result");
        return ret(cudaErrorInvalidValue);
    }
    if (sticky_err) return ret(sticky_err);
    if (!a->timing || !b->timing) return ret(cudaErrorInvalidResourceHandle);
    pthread_mutex_lock(&a->mu);
    const uint64_t ar = a->rec, ad = a->done;
    const double at = a->t;
    pthread_mutex_unlock(&a->mu);
    pthread_mutex_lock(&b->mu);
    const uint64_t br = b->rec, bd = b->done;
    const double bt = b->t;
    pthread_mutex_unlock(&b->mu);
    if (!ar || !br) return ret(cudaErrorInvalidResourceHandle);
    if (ad < ar || bd < br) return ret(cudaErrorNotReady);
    *ms = (float)((bt - at) * 1e3);
    return cudaSuccess;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags) {
    mevent *m = EV(e, "cudaStreamWaitEvent");
    if (!m) return ret(cudaErrorInvalidResourceHandle);
    if (flags != cudaEventWaitDefault) {
        mock_report("cudaStreamWaitEvent: flags %#x (only cudaEventWaitDefault is modelled)", flags);
        return ret(cudaErrorInvalidValue);
    }
    pthread_mutex_lock(&m->mu);
    uint64_t g = m->rec; /* the latest record at the time of the call, as in CUDA */
    pthread_mutex_unlock(&m->mu);
    push(S(s), (op){.kind = OP_WAIT, .ev = m, .gen = g});
    return cudaSuccess;
}

/* the memory type of p: device, pinned host (cudaMemoryTypeHost), managed, or unregistered */
static int mem_type(const void *p) {
    int type;
    return find(p, NULL, NULL, &type) ? type : cudaMemoryTypeUnregistered;
}
/* 1 (reported) when n bytes at p run past the end of its pinned allocation */
static int pinned_overrun(const void *p, size_t n, const char *what) {
    void *base;
    size_t size;
    if (!find(p, &base, &size, NULL)) return 0;
    size_t off = (size_t)((const char *)p - (const char *)base);
    if (off + n <= size) return 0;
    mock_report("%s: %zu bytes at offset %zu overrun the %zu-byte pinned allocation by %zu bytes", what, n, off, size,
                off + n - size);
    return 1;
}
static const char *type_name(int type) {
    return type == cudaMemoryTypeDevice ? "device" : type == cudaMemoryTypeHost ? "pinned host"
           : type == cudaMemoryTypeManaged ? "managed" : "pageable host";
}
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, enum cudaMemcpyKind k, cudaStream_t st) {
    if (sticky_err) return ret(sticky_err);
    if (n == 0) return cudaSuccess;
    const int dt = mem_type(d), stype = mem_type(s);
    /* device side (dd, sd) and host side (dh, sh): managed memory passes as either */
    const int dd = dt == cudaMemoryTypeDevice || dt == cudaMemoryTypeManaged, dh = dt != cudaMemoryTypeDevice;
    const int sd = stype == cudaMemoryTypeDevice || stype == cudaMemoryTypeManaged, sh = stype != cudaMemoryTypeDevice;
    if ((k == cudaMemcpyHostToDevice && (!dd || !sh)) || (k == cudaMemcpyDeviceToHost && (!dh || !sd)) ||
        (k == cudaMemcpyDeviceToDevice && (!dd || !sd)) || (k == cudaMemcpyHostToHost && (!dh || !sh)) ||
        (k != cudaMemcpyHostToDevice && k != cudaMemcpyDeviceToHost && k != cudaMemcpyDeviceToDevice &&
         k != cudaMemcpyHostToHost && k != cudaMemcpyDefault)) {
        mock_report("cudaMemcpyAsync kind %d does not match the pointers (dst %s, src %s)", (int)k, type_name(dt),
                    type_name(stype));
        return ret(cudaErrorInvalidValue);
    }
    if (dd && mock_check_dev_range(d, n, "cudaMemcpyAsync destination")) return ret(cudaErrorInvalidValue);
    if (sd && mock_check_dev_range(s, n, "cudaMemcpyAsync source")) return ret(cudaErrorInvalidValue);
    if ((dt == cudaMemoryTypeHost && pinned_overrun(d, n, "cudaMemcpyAsync destination")) ||
        (stype == cudaMemoryTypeHost && pinned_overrun(s, n, "cudaMemcpyAsync source")))
        return ret(cudaErrorInvalidValue);
    const int pageable_src = stype == cudaMemoryTypeUnregistered, pageable_dst = dt == cudaMemoryTypeUnregistered;
    void *staging = NULL;
    if (pageable_src) { /* pageable source: CUDA stages it, the caller may reuse it at once */
        staging = malloc(n);
        memcpy(staging, s, n);
        s = staging;
    }
    if (pageable_dst) count_sync();
    push(S(st), (op){.kind = OP_COPY, .dst = d, .src = s, .n = n, .staging = staging});
    if (pageable_dst) drain(S(st)); /* into pageable memory: returns when done, as in CUDA */
    return cudaSuccess;
}
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, enum cudaMemcpyKind k) {
    if (mem_type(d) != cudaMemoryTypeUnregistered) count_sync(); /* (cudaMemcpyAsync counts one into pageable memory) */
    cudaError_t e = cudaMemcpyAsync(d, s, n, k, NULL);
    drain(S(NULL));
    return e != cudaSuccess ? e : sticky_err ? ret(sticky_err) : cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *d, int v, size_t n, cudaStream_t st) {
    if (sticky_err) return ret(sticky_err);
    if (n == 0) return cudaSuccess;
    if (mock_check_dev_range(d, n, "cudaMemsetAsync")) return ret(cudaErrorInvalidValue);
    push(S(st), (op){.kind = OP_SET, .dst = d, .v = v, .n = n});
    return cudaSuccess;
}

/* ---------------------------------------------------------------- kernels */

/* Fibers: x86-64 SysV context switch. Saves the callee-saved registers, MXCSR and the x87
 * control word on the current stack, stores the stack pointer in *save, switches to `to`. */
void emu_swap(void **save, void *to);
__asm__(".text\n"
        ".globl emu_swap\n"
        ".hidden emu_swap\n"
        ".type emu_swap,@function\n"
        "emu_swap:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size emu_swap, .-emu_swap\n");

#define MAX_THREADS 1024
#define FIBER_STACK ((MOCK_ASAN ? 256u : 64u) << 10)

enum { F_RUN, F_WAIT_BLOCK, F_WAIT_WARP, F_DONE };
typedef struct fiber { void *sp; char *stack; int state; void *site; const char *bar; } fiber;

struct emu_uint3 emu_threadIdx, emu_blockIdx, emu_blockDim, emu_gridDim;
double emu_xbuf[MAX_THREADS];

/* One kernel runs at a time, whatever its stream: __shared__ variables are statics and the
 * built-in indices are globals. */
static pthread_mutex_t kernel_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    fiber f[MAX_THREADS];
    void *main_sp;
    fiber *cur;
    unsigned nt;
    void (*body)(void *);
    void *closure;
    const char *kname;
    int bad; /* this block hit a kernel error */
    int warned_sync_exit;
#if MOCK_ASAN
    const void *main_bottom;
    size_t main_size;
    void *main_fake;
#endif
} K;

static void to_main(int exiting) {
    fiber *f = K.cur;
#if MOCK_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(exiting ? NULL : &fake, K.main_bottom, K.main_size);
    emu_swap(&f->sp, K.main_sp);
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
    (void)exiting;
    emu_swap(&f->sp, K.main_sp);
#endif
}

static void fiber_main(void) {
#if MOCK_ASAN
    __sanitizer_finish_switch_fiber(NULL, &K.main_bottom, &K.main_size);
#endif
    K.body(K.closure);
    K.cur->state = F_DONE;
    to_main(1);
    abort(); /* never resumed */
}

static void fiber_init(fiber *f) {
    if (!f->stack) {
        char *m = mmap(NULL, FIBER_STACK + 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                       -1, 0);
        if (m == MAP_FAILED) {
            perror("MOCK: mmap of a fiber stack");
            abort();
        }
        mprotect(m, 4096, PROT_NONE); /* guard page: a stack overflow faults */
        f->stack = m + 4096;
    }
#if MOCK_ASAN
    __asan_unpoison_memory_region(f->stack, FIBER_STACK);
#endif
    uint64_t *top = (uint64_t *)(f->stack + FIBER_STACK);
    top[-1] = 0; /* fiber_main's "return address": keeps the stack 16-byte aligned at entry */
    top[-2] = (uint64_t)(uintptr_t)fiber_main;
    for (int i = 3; i <= 8; i++) top[-i] = 0; /* rbp rbx r12 r13 r14 r15 */
    uint32_t *fpu = (uint32_t *)&top[-9];
    fpu[0] = 0x1f80; /* MXCSR default */
    fpu[1] = 0x037f; /* x87 control word default */
    f->sp = &top[-9];
    f->state = F_RUN;
}

static void resume(unsigned t) {
    fiber *f = &K.f[t];
    K.cur = f;
    unsigned bx = emu_blockDim.x, bxy = emu_blockDim.x * emu_blockDim.y;
    emu_threadIdx.x = t % bx;
    emu_threadIdx.y = t % bxy / bx;
    emu_threadIdx.z = t / bxy;
#if MOCK_ASAN
    __sanitizer_start_switch_fiber(&K.main_fake, f->stack, FIBER_STACK);
    emu_swap(&K.main_sp, f->sp);
    __sanitizer_finish_switch_fiber(K.main_fake, NULL, NULL);
#else
    emu_swap(&K.main_sp, f->sp);
#endif
}

static void kernel_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void kernel_error(const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mock_report("kernel %s, block (%u,%u,%u) of grid (%u,%u,%u), block size (%u,%u,%u): %s", K.kname, emu_blockIdx.x,
                emu_blockIdx.y, emu_blockIdx.z, emu_gridDim.x, emu_gridDim.y, emu_gridDim.z, emu_blockDim.x,
                emu_blockDim.y, emu_blockDim.z, msg);
    K.bad = 1;
}

/* `bar`: the barrier's source position ("file:line", emu/cuda_runtime.h's __syncthreads), so
 * that threads waiting at different barriers can be told apart; not the return address, which
 * differs where the compiler has copied one barrier into two paths (GCC does, after a loop
 * that may run zero times). Two calls of one helper (dtk_block_reduce) share a position, so
 * threads at different calls of it are not told apart. `site` (warp shuffles): the caller's
 * return address. */
__attribute__((noinline)) void emu_syncthreads(const char *bar) {
    K.cur->bar = bar;
    K.cur->state = F_WAIT_BLOCK;
    to_main(0);
}

__attribute__((noinline)) void emu_warp_sync(unsigned mask) {
    K.cur->site = __builtin_return_address(0);
    if (mask != 0xffffffffu)
        kernel_error("thread %u: warp sync with mask %#x (the mock supports full masks only)",
                     (unsigned)(K.cur - K.f), mask);
    K.cur->state = F_WAIT_WARP;
    to_main(0);
}

/* Runs one block to completion: every runnable thread until it blocks or ends, then releases
 * the barriers that all their threads have reached. 0 on success. */
static int run_block(int rev) {
    const unsigned nt = K.nt, nw = (nt + 31) / 32;
    for (unsigned t = 0; t < nt; t++) fiber_init(&K.f[t]);
    K.bad = 0;
    for (;;) {
        for (unsigned i = 0; i < nt && !K.bad; i++) {
            unsigned t = rev ? nt - 1 - i : i;
            if (K.f[t].state == F_RUN) resume(t);
        }
        if (K.bad) return 1;
        unsigned done = 0, at_block = 0;
        for (unsigned t = 0; t < nt; t++) {
            done += K.f[t].state == F_DONE;
            at_block += K.f[t].state == F_WAIT_BLOCK;
        }
        if (done == nt) return 0;
        int released = 0;
        if (at_block && at_block + done == nt) { /* __syncthreads: everyone still running is there */
            if (done && !K.warned_sync_exit) {
                K.warned_sync_exit = 1;
                fprintf(stderr, "MOCK WARNING: kernel %s: __syncthreads reached after %u of %u threads of the block "
                        "exited (allowed on sm_70+, but fragile)\n", K.kname, done, nt);
            }
            const char *bar = NULL;
            for (unsigned t = 0; t < nt; t++)
                if (K.f[t].state == F_WAIT_BLOCK) {
                    if (bar && strcmp(K.f[t].bar, bar) != 0) {
                        kernel_error("threads wait at different __syncthreads() calls (thread %u at %s, others at %s): "
                                     "a barrier in divergent code", t, K.f[t].bar, bar);
                        return 1;
                    }
                    bar = K.f[t].bar;
                }
            for (unsigned t = 0; t < nt; t++)
                if (K.f[t].state == F_WAIT_BLOCK) K.f[t].state = F_RUN;
            released = 1;
        }
        for (unsigned w = 0; w < nw; w++) { /* warp shuffles: all 32 lanes at the same one */
            unsigned lo = w * 32, hi = lo + 32 < nt ? lo + 32 : nt, wait = 0, wdone = 0;
            for (unsigned t = lo; t < hi; t++) {
                wait += K.f[t].state == F_WAIT_WARP;
                wdone += K.f[t].state == F_DONE;
            }
            if (!wait) continue;
            if (wait == 32) {
                for (unsigned t = lo; t < hi; t++)
                    if (K.f[t].site != K.f[lo].site) {
                        kernel_error("warp %u: lanes %u and %u are in different warp shuffles", w, lo, t);
                        return 1;
                    }
                for (unsigned t = lo; t < hi; t++) K.f[t].state = F_RUN;
                released = 1;
            } else if (wait + wdone == hi - lo) {
                kernel_error("warp %u: a full-mask warp shuffle reached by %u lanes while %u lanes %s", w, wait,
                             32 - wait,
                             hi - lo < 32 ? "do not exist (block size not a multiple of 32)" : "have exited");
                return 1;
            }
        }
        if (!released) {
            kernel_error("deadlock: threads wait at different barriers (%u at __syncthreads, %u exited, %u at warp "
                         "shuffles)", at_block, done, nt - at_block - done);
            return 1;
        }
    }
}

typedef struct launch {
    const char *name;
    unsigned g[3], b[3];
    void (*body)(void *);
    void *closure;
    void (*destroy)(void *);
} launch;

static void run_kernel(void *arg) {
    launch *L = arg;
    if (!sticky_err) {
        pthread_mutex_lock(&kernel_mu);
        const char *o = getenv("MOCK_ORDER");
        const int rev = o && strcmp(o, "rev") == 0;
        emu_gridDim = (struct emu_uint3){L->g[0], L->g[1], L->g[2]};
        emu_blockDim = (struct emu_uint3){L->b[0], L->b[1], L->b[2]};
        K.nt = L->b[0] * L->b[1] * L->b[2];
        K.body = L->body;
        K.closure = L->closure;
        K.kname = L->name;
        K.warned_sync_exit = 0;
        const uint64_t nb = (uint64_t)L->g[0] * L->g[1] * L->g[2];
        for (uint64_t i = 0; i < nb; i++) {
            uint64_t j = rev ? nb - 1 - i : i;
            emu_blockIdx.x = (unsigned)(j % L->g[0]);
            emu_blockIdx.y = (unsigned)(j / L->g[0] % L->g[1]);
            emu_blockIdx.z = (unsigned)(j / ((uint64_t)L->g[0] * L->g[1]));
            if (run_block(rev)) {
                set_sticky(cudaErrorLaunchFailure);
                break;
            }
        }
        pthread_mutex_unlock(&kernel_mu);
    }
    L->destroy(L->closure);
    free(L);
}

void mock_kernel_launch(const char *name, const unsigned g[3], const unsigned b[3], size_t shmem, void *s,
                        void (*body)(void *), void *closure, void (*destroy)(void *)) {
    const uint64_t nt = (uint64_t)b[0] * b[1] * b[2];
    if (strncmp(name, "dtk_", 4) != 0) { /* kernels/dtk_common.cuh: gpu-check's sanitizer steps select dtk_ */
        mock_report("launch of %s: dtrain's kernels are named dtk_... (gpu-check.sh's compute-sanitizer "
                    "steps check only those)", name);
        destroy(closure);
        return;
    }
    if (shmem) {
        mock_report("launch of %s: dynamic shared memory (%zu bytes) is not supported by the mock", name, shmem);
        destroy(closure);
        return;
    }
    const char *why = NULL;
    if (!g[0] || !g[1] || !g[2]) why = "a grid dimension is 0";
    else if (!b[0] || !b[1] || !b[2]) why = "a block dimension is 0";
    else if (nt > MAX_THREADS) why = "more than 1024 threads per block";
    else if (b[2] > 64) why = "blockDim.z > 64";
    else if (g[1] > 65535 || g[2] > 65535) why = "gridDim.y or gridDim.z > 65535";
    else if (g[0] > 0x7fffffffu) why = "gridDim.x > 2^31-1";
    if (why) {
        fprintf(stderr, "MOCK: launch of %s <<<(%u,%u,%u), (%u,%u,%u)>>> rejected: %s "
                "(cudaErrorInvalidConfiguration)\n", name, g[0], g[1], g[2], b[0], b[1], b[2], why);
        destroy(closure);
        ret(cudaErrorInvalidConfiguration);
        return;
    }
    if (sticky_err) {
        destroy(closure);
        return;
    }
    __atomic_add_fetch(&n_kernels, 1, __ATOMIC_SEQ_CST);
    prof_note("kernel %s %u %u %u %u %u %u\n", name, g[0], g[1], g[2], b[0], b[1], b[2]);
    launch *L = malloc(sizeof *L);
    *L = (launch){name, {g[0], g[1], g[2]}, {b[0], b[1], b[2]}, body, closure, destroy};
    push(S(s), (op){.kind = OP_FN, .fn = run_kernel, .arg = L});
}

void mock_check_kernel_ptr(const char *kname, int argi, const void *p) {
    if (!p) return;
    int type;
    if (!find(p, NULL, NULL, &type)) {
        /* one past the end of an allocation is fine as long as it is not dereferenced */
        if (find((const char *)p - 1, NULL, NULL, &type) && type == cudaMemoryTypeDevice) return;
        mock_report("kernel %s: argument %d (%p) is not device memory", kname, argi, p);
        set_sticky(cudaErrorIllegalAddress); /* what dereferencing it on a GPU gives */
    } else if (type == cudaMemoryTypeHost) {
        mock_report("kernel %s: argument %d (%p) is pinned host memory (legal through UVA, but slow: probably a bug)",
                    kname, argi, p);
    }
}
