/* comm_nccl.c — the `nccl` collective backend: GPU workers, one CUDA device per rank, on one
 * machine or several (CUDA builds only).
 *
 * Setup: `boot`, a working host communicator of the same job (shm, tcp or mpi), gives rank
 * and world and carries NCCL's unique id from rank 0 to the others. In fork mode boot is the
 * launcher's shared-memory world: the id is made by rank 0 after fork and passed through the
 * launcher's shared memory. Every rank first reports over boot whether its local setup
 * (library, device, stream, events, scratch) worked, so that one rank's failure makes all of
 * them fail at once instead of leaving the others waiting in ncclCommInitRank.
 *
 * Every collective runs on the communicator's thread (comm.c), in issue order:
 *
 *   compute stream --ready--> our stream: [H2D staging] NCCL call --done--> host polls `done`
 *
 * `ready` is recorded on the caller's compute stream by `prepare`, on the caller's thread when
 * the collective is queued (a ring of events, consumed in issue order by the collectives), so
 * the NCCL call waits for exactly what was queued there before dt_comm_*_start (a gradient
 * bucket), not for the rest of backward queued since: the buckets overlap backward. The call
 * runs on this backend's own non-blocking stream.
 *
 * Several in flight (comm.h: issue, poll): the float collectives of device buffers (a gradient
 * bucket's all-reduce or reduce-scatter, ZeRO-1's all-gathers of parts) are queued on our stream
 * as soon as the caller starts them, each behind its own `ready` and with its own `done` (a
 * ring of N_FLIGHT), without waiting for the one before, as llm.c does: every bucket that
 * backward has finished is on the device at once, and the last one (the embeddings, ready only
 * after the last backward kernel) follows the others without a round trip through the host.
 * The thread polls the oldest `done` (cudaEventQuery; a short spin, then 50 us sleeps, between
 * which it queues any new bucket) and NCCL's asynchronous error state on every round, each
 * collective against its own deadline (training.collective_timeout_s, or the barrier's own)
 * counted from its issue. The others (host buffers, whose copy back must wait for `done`;
 * broadcast, all-gather, barrier; a bf16 buffer to grow) run one at a time once nothing is in
 * flight, polled the same way. A timeout or an NCCL error aborts the NCCL communicator
 * (ncclCommAbort stops kernels waiting for a dead peer) and gives up every collective in
 * flight; comm.c fails them and every later call at once.
 *
 * Each completed collective that waited for the compute stream also leaves its exposed time
 * (dt_comm_last_exposed_ms): `waited` to `done` on the device (cudaEventElapsedTime; the ring's
 * events keep timing for that), the time it ended after the compute it had to wait for.
 *
 * Host buffers (small things) are staged through a device scratch buffer that grows as
 * needed: H2D on our stream before the NCCL call; D2H only after `done` was seen, since a
 * copy into pageable memory blocks the calling thread until the stream reaches it (it would
 * wait for the NCCL call with no deadline).
 *
 * NCCL is not linked: it is opened with dlopen ("libnccl.so.<NCCL_MAJOR>") the first time a
 * GPU run makes this communicator, like cuBLASLt in ops_cuda.c (linking it would cost every
 * process, CPU runs too, ~150 MB of resident memory). The CUDA runtime is linked. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* nanosleep, clock_gettime, gethostname under -std=c11 */
#endif
#include "dtrain/comm.h"

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include "dtrain/clock.h"
#include "dtk.h"

/* ---- NCCL, loaded at run time ---- */

#define NCCL_FUNCS(X)                                                                                  \
    X(ncclGetVersion) X(ncclGetUniqueId) X(ncclCommInitRank) X(ncclCommDestroy) X(ncclCommAbort)    \
    X(ncclCommGetAsyncError) X(ncclGetErrorString) X(ncclGetLastError) X(ncclAllReduce)             \
    X(ncclBroadcast) X(ncclAllGather) X(ncclReduceScatter) X(ncclReduce) X(ncclGroupStart) X(ncclGroupEnd)

static struct {
#define X(f) __typeof__(f) *f;
    NCCL_FUNCS(X)
#undef X
} nc;
static pthread_once_t nc_once = PTHREAD_ONCE_INIT;
static char nc_error[512]; /* empty when the table is complete */

#define NC_MIN_VERSION 21300 /* ncclGetLastError and ncclRemoteError: 2.13; ncclAvg: 2.10 */

static void nc_load(void) {
    char soname[64];
    snprintf(soname, sizeof soname, "libnccl.so.%d", NCCL_MAJOR);
    void *h = dlopen(soname, RTLD_NOW | RTLD_LOCAL); /* never closed: NCCL keeps threads */
    if (!h) {
        snprintf(nc_error, sizeof nc_error, "cannot load %s: %s (hint: install NCCL %d, e.g. apt-get install libnccl2, "
                 "or add the directory that holds %s, e.g. $NCCL_HOME/lib, to LD_LIBRARY_PATH)", soname, dlerror(),
                 NCCL_MAJOR, soname);
        return;
    }
#define X(f)                                                                                             \
    if (!(*(void **)&nc.f = dlsym(h, #f))) {                                                            \
        snprintf(nc_error, sizeof nc_error, "%s has no symbol %s: an older NCCL than dtrain needs (2.13 or " \
                 "newer; built with %d.%d.%d)", soname, #f, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);             \
        return;                                                                                          \
    }
    NCCL_FUNCS(X)
#undef X
    int v = 0;
    if (nc.ncclGetVersion(&v) != ncclSuccess || v < NC_MIN_VERSION)
        snprintf(nc_error, sizeof nc_error, "%s is NCCL version code %d: dtrain needs NCCL 2.13 or newer (built with "
                 "%d.%d.%d)", soname, v, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
}

/* ---- the backend's state ---- */

#define SCRATCH_MIN ((size_t)1 << 20) /* made at init: the barrier's float and small host buffers */
#define SPIN_S 100e-6                 /* poll without sleeping this long: small buckets finish in it */
#define NAP_NS 50000L                 /* then sleep this long between polls */
#define N_MARKS 256                   /* collectives queued and not yet run, at most (more: late events) */
#define N_FLIGHT 32                   /* collectives in flight at once, at most (GPT-2 124M has 14 buckets) */

/* One collective from its issue until it has landed (completed, seen by the host). */
typedef struct flight {
    cudaEvent_t ready;      /* on `compute`, recorded at issue: for a collective without a mark */
    cudaEvent_t done;       /* on our stream: its NCCL call (and staging, bf16 widening) finished */
    cudaEvent_t waited;     /* what our stream waited for on `compute` (mark or ready); NULL: nothing */
    cudaEvent_t mark;       /* its mark, when holds_mark */
    int holds_mark;         /* a mark of the ring that prepare must not record again until it lands */
    double t0;              /* when it was queued: its deadline counts from here */
    dt_comm_deadline dl;    /* a copy of comm.c's, which lives only during the call */
    char op[128];           /* for messages: "all-reduce #3 (1000 floats, sum)" */
} flight;

typedef struct nccl_ctx {
    int rank, world, device;
    char host[64];
    ncclComm_t comm;        /* NULL once aborted */
    int failed;             /* a collective failed: free aborts instead of destroying */
    int thread_ready;       /* cudaSetDevice done on the communicator's thread */
    cudaStream_t compute;   /* the caller's: the buffers are written there (not ours) */
    cudaStream_t stream;    /* ours, non-blocking: staging copies and the NCCL calls */
    /* marks: events recorded on `compute` by prepare (caller's thread), one per queued
     * collective, used in the same order by the collectives (comm thread) */
    pthread_mutex_t marks_mu;
    int marks_mu_ok;
    cudaEvent_t marks[N_MARKS];
    int mark_ok[N_MARKS];
    unsigned long marks_made, marks_used;
    unsigned long marks_held; /* used, and held by collectives that have not landed */
    int marks_off;          /* the ring overflowed or could not be made: late events only */
    double exposed_ms;      /* under marks_mu: dt_comm_last_exposed_ms (NAN: none yet) */
    flight fl[N_FLIGHT];    /* collective k is fl[k % N_FLIGHT]; in flight: landed <= k < seq */
    unsigned long landed;
    flight *cur;            /* the one being issued or run */
    void *scratch;          /* device memory: host buffers are staged here */
    size_t scratch_bytes;
    void *wire;             /* device memory: DT_WIRE_BF16 gradients as they travel */
    size_t wire_bytes;
    unsigned long seq;      /* collectives issued so far (numbered in messages from 1) */
    char op[128];           /* the collective the messages name: being issued, run or polled */
} nccl_ctx;

/* "<call> failed at file:line on rank R (host H, GPU D): <error>", and the collective it was in. */
static dt_status cuda_fail(nccl_ctx *x, cudaError_t e, const char *call, const char *file, int line) {
    (void)cudaGetLastError(); /* clear a non-sticky error; a sticky one stays whatever we do */
    return dt_error_set(DT_ERR_DEVICE, "%s failed at %s:%d on rank %d (host %s, GPU %d): %s (%s)%s%s", call, file, line,
                        x->rank, x->host, x->device, cudaGetErrorString(e), cudaGetErrorName(e),
                        x->op[0] ? ", in nccl " : "", x->op);
}

static dt_status nccl_fail(nccl_ctx *x, ncclResult_t r, const char *call, const char *file, int line) {
    const char *last = nc.ncclGetLastError ? nc.ncclGetLastError(x->comm) : NULL;
    return dt_error_set(DT_ERR_DEVICE, "%s failed at %s:%d on rank %d (host %s, GPU %d): %s (ncclResult_t %d)%s%s%s%s "
                        "(hint: NCCL_DEBUG=WARN prints NCCL's own log)", call, file, line, x->rank, x->host, x->device,
                        nc.ncclGetErrorString ? nc.ncclGetErrorString(r) : "NCCL error", (int)r,
                        last && last[0] ? ": " : "", last && last[0] ? last : "", x->op[0] ? ", in nccl " : "", x->op);
}

/* DT_OK or DT_ERR_DEVICE with the message above; use as DT_TRY(CK(cudaFoo, args...)). */
#define CK(f, ...) ck_cuda(x, f(__VA_ARGS__), #f, __FILE__, __LINE__)
#define NC(f, ...) ck_nccl(x, nc.f(__VA_ARGS__), #f, __FILE__, __LINE__)
static dt_status ck_cuda(nccl_ctx *x, cudaError_t e, const char *call, const char *file, int line) {
    return e == cudaSuccess ? DT_OK : cuda_fail(x, e, call, file, line);
}
static dt_status ck_nccl(nccl_ctx *x, ncclResult_t r, const char *call, const char *file, int line) {
    return r == ncclSuccess ? DT_OK : nccl_fail(x, r, call, file, line);
}

/* the bytes grow_buf allocates for `bytes` */
static size_t buf_bytes(size_t bytes) {
    return bytes < SCRATCH_MIN ? SCRATCH_MIN : (bytes + 0xFFFFF) & ~(size_t)0xFFFFF;
}

size_t dt_comm_nccl_device_bytes(size_t wire_floats) {
    return buf_bytes(SCRATCH_MIN) + (wire_floats ? buf_bytes(wire_floats * 2) : 0);
}

/* A staging buffer (*p, *have bytes) with at least `bytes` (grown in whole MiB, never shrunk).
 * Growing frees the old one (cudaFree waits for the device); nothing of ours is in flight at
 * that point: only blocking collectives and reservations grow, which comm.c runs once every
 * collective in flight has landed (nccl_issue declines a bucket that would grow one). */
static dt_status grow_buf(nccl_ctx *x, void **p, size_t *have, size_t bytes, const char *what) {
    if (*p && *have >= bytes) return DT_OK;
    if (*p) DT_TRY(CK(cudaFree, *p));
    *p = NULL;
    *have = 0;
    size_t want = buf_bytes(bytes);
    if (want < bytes) return dt_error_set(DT_ERR_INTERNAL, "nccl: a %s of %zu bytes is too large", what, bytes);
    cudaError_t e = cudaMalloc(p, want);
    if (e != cudaSuccess) {
        *p = NULL;
        (void)cudaGetLastError(); /* an allocation failure is not sticky */
        return dt_error_set(DT_ERR_DEVICE, "cudaMalloc of %zu bytes for the nccl %s failed on rank %d (host "
                            "%s, GPU %d): %s%s%s (hint: pass device buffers to the collectives)", want, what, x->rank,
                            x->host, x->device, cudaGetErrorString(e), x->op[0] ? ", in nccl " : "", x->op);
    }
    *have = want;
    return DT_OK;
}

static dt_status grow_scratch(nccl_ctx *x, size_t bytes) {
    return grow_buf(x, &x->scratch, &x->scratch_bytes, bytes, "staging buffer");
}

/* *on_device: 1 for device (or managed) memory, used as it is; 0 for host memory, staged.
 * Memory of another GPU than the communicator's is an error. */
static dt_status classify(nccl_ctx *x, const void *p, const char *what, int *on_device) {
    struct cudaPointerAttributes a;
    memset(&a, 0, sizeof a);
    *on_device = 0;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError(); /* runtimes before 11 said so for pageable host memory */
        return DT_OK;
    }
    if (a.type == cudaMemoryTypeManaged) {
        *on_device = 1;
    } else if (a.type == cudaMemoryTypeDevice) {
        if (a.device != x->device)
            return dt_error_set(DT_ERR_INTERNAL, "nccl %s on rank %d (host %s): the %s buffer is memory of GPU %d, the "
                                "communicator's GPU is %d", x->op, x->rank, x->host, what, a.device, x->device);
        *on_device = 1;
    } /* cudaMemoryTypeUnregistered (pageable) and cudaMemoryTypeHost (pinned): staged */
    return DT_OK;
}

/* The communicator's thread makes `device` current once, before its first CUDA call. */
static dt_status thread_setup(nccl_ctx *x) {
    if (!x->comm)
        return dt_error_set(DT_ERR_DEVICE, "nccl %s on rank %d (host %s): the NCCL communicator was aborted after an "
                            "earlier failure", x->op, x->rank, x->host);
    if (!x->thread_ready) {
        DT_TRY(CK(cudaSetDevice, x->device));
        x->thread_ready = 1;
    }
    return DT_OK;
}

/* Caller's thread, as a collective is queued: mark where the compute stream stands. */
static void nccl_prepare(void *vctx) {
    nccl_ctx *x = vctx;
    pthread_mutex_lock(&x->marks_mu);
    /* the slot to record is free unless it is still queued for, or held by, a collective */
    if (!x->marks_off && x->marks_made - x->marks_used + x->marks_held >= N_MARKS) x->marks_off = 1;
    if (!x->marks_off) {
        size_t i = x->marks_made % N_MARKS;
        x->mark_ok[i] = cudaEventRecord(x->marks[i], x->compute) == cudaSuccess;
        if (!x->mark_ok[i]) (void)cudaGetLastError(); /* the collective records its own, later */
        x->marks_made++;
    }
    pthread_mutex_unlock(&x->marks_mu);
}

/* Comm thread, first thing in every collective: this collective's mark, if it has one, held
 * until the collective lands (the timeout's message and the exposed time query it then). */
static int take_mark(nccl_ctx *x, cudaEvent_t *ev) {
    int have = 0;
    pthread_mutex_lock(&x->marks_mu);
    if (!x->marks_off && x->marks_used < x->marks_made) {
        size_t i = x->marks_used % N_MARKS;
        have = x->mark_ok[i];
        *ev = x->marks[i];
        x->marks_used++;
        x->marks_held += (unsigned long)have;
    }
    pthread_mutex_unlock(&x->marks_mu);
    return have;
}

static void release_mark(nccl_ctx *x, flight *f) {
    if (!f->holds_mark) return;
    pthread_mutex_lock(&x->marks_mu);
    x->marks_held--;
    pthread_mutex_unlock(&x->marks_mu);
    f->holds_mark = 0;
}

/* Our stream waits for what the caller had queued on the compute stream when it queued this
 * collective (its mark), or, without a mark, for everything queued there so far. The
 * collective's deadline counts from here. */
static dt_status after_compute(nccl_ctx *x) {
    flight *f = x->cur;
    f->t0 = dt_clock_now();
    if (!f->holds_mark) DT_TRY(CK(cudaEventRecord, f->ready, x->compute));
    f->waited = f->holds_mark ? f->mark : f->ready;
    return CK(cudaStreamWaitEvent, x->stream, f->waited, 0);
}

/* cudaEventQuery, with its "not ready" cleared from this thread's last error, where the
 * runtime also leaves it: the next kernel launch's cudaGetLastError (dtk_*) would return it as
 * its own failure (pytorch/pytorch#18584 met the same) */
static cudaError_t event_query(cudaEvent_t e) {
    const cudaError_t r = cudaEventQuery(e);
    if (r == cudaErrorNotReady) (void)cudaGetLastError();
    return r;
}

/* One look at collective f (its name in x->op): *done 1 once its `done` has completed; else
 * NCCL's asynchronous error and f's deadline are checked. */
static dt_status look(nccl_ctx *x, flight *f, int *done) {
    *done = 0;
    cudaError_t e = event_query(f->done);
    if (e == cudaSuccess) {
        *done = 1;
        return DT_OK;
    }
    if (e != cudaErrorNotReady) return cuda_fail(x, e, "cudaEventQuery", __FILE__, __LINE__);
    ncclResult_t async = ncclSuccess;
    DT_TRY(NC(ncclCommGetAsyncError, x->comm, &async));
    if (async != ncclSuccess && async != ncclInProgress) {
        const char *last = nc.ncclGetLastError(x->comm);
        return dt_error_set(DT_ERR_DEVICE, "nccl %s on rank %d (host %s, GPU %d) failed: NCCL reports an "
                            "asynchronous error: %s (ncclResult_t %d)%s%s (hint: a peer worker died, or the network "
                            "between the hosts failed; NCCL_DEBUG=WARN prints NCCL's own log)", x->op, x->rank,
                            x->host, x->device, nc.ncclGetErrorString(async), (int)async,
                            last && last[0] ? ": " : "", last && last[0] ? last : "");
    }
    const double timeout_s = f->dl.timeout_s;
    if (dt_clock_now() - f->t0 > timeout_s) {
        if (f->waited && event_query(f->waited) == cudaErrorNotReady)
            return dt_error_set(DT_ERR_DEVICE, "collective timeout: nccl %s on rank %d (host %s, GPU %d) waited "
                                "%.1f s for the GPU work queued before it on the compute stream, which did not "
                                "finish (a kernel hung, or the step is slower than the deadline%s)", x->op, x->rank,
                                x->host, x->device, timeout_s, f->dl.setting);
        return dt_error_set(DT_ERR_DEVICE, "collective timeout: nccl %s on rank %d (host %s, GPU %d) did not finish "
                            "in %.1f s: a peer worker died, hung or stopped, or never issued this collective (hint: "
                            "the launcher's log names a worker that exited%s)", x->op, x->rank, x->host, x->device,
                            timeout_s, f->dl.setting);
    }
    return DT_OK;
}

/* Between two looks at f: none for its first SPIN_S, then a nap (no busy loop). */
static void nap(const flight *f) {
    const struct timespec t = {0, NAP_NS};
    if (dt_clock_now() - f->t0 > SPIN_S) nanosleep(&t, NULL);
}

/* The oldest collective in flight, f, has completed: its mark may be recorded again, and its
 * exposed time, when it waited for the compute stream, is the last one. */
static void land(nccl_ctx *x, flight *f) {
    float ms = NAN;
    if (f->waited && cudaEventElapsedTime(&ms, f->waited, f->done) != cudaSuccess) {
        (void)cudaGetLastError(); /* no measure this time (NAN): the caller uses its own wait */
        ms = NAN;
    }
    pthread_mutex_lock(&x->marks_mu);
    if (f->waited) x->exposed_ms = ms < 0 ? 0.0 : (double)ms; /* the clocks' resolution */
    pthread_mutex_unlock(&x->marks_mu);
    release_mark(x, f);
    x->landed++;
}

/* Records `done` after the queued work and polls it until it completes, NCCL reports an
 * error, or the collective's deadline has passed; then it has landed. */
static dt_status wait_done(nccl_ctx *x) {
    flight *f = x->cur;
    DT_TRY(CK(cudaEventRecord, f->done, x->stream));
    for (;;) {
        int done;
        DT_TRY(look(x, f, &done));
        if (done) break;
        nap(f);
    }
    land(x, f);
    return DT_OK;
}

/* Copies the staged result back to host memory: only after `done`, see the top. */
static dt_status download(nccl_ctx *x, void *dst, const void *src, size_t bytes) {
    DT_TRY(CK(cudaMemcpyAsync, dst, src, bytes, cudaMemcpyDeviceToHost, x->stream));
    return CK(cudaStreamSynchronize, x->stream);
}

/* A failed collective leaves the ranks out of step: abort the NCCL communicator (kernels that
 * wait for a peer stop) and say so; every collective in flight is given up (comm.c fails them
 * and every later call with this message). */
static dt_status failed(nccl_ctx *x, dt_status st) {
    x->failed = 1;
    for (; x->landed < x->seq; x->landed++) release_mark(x, &x->fl[x->landed % N_FLIGHT]);
    if (x->comm) {
        nc.ncclCommAbort(x->comm);
        x->comm = NULL;
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", dt_error_msg());
        dt_error_set(st, "%s; the NCCL communicator was aborted", msg);
    }
    return st;
}

/* ---- the collectives ---- */

/* The start of every collective: its deadline, its own mark of the compute stream (in order),
 * its number and its name for messages ("all-reduce #12 (...)": FMT's first argument is the
 * number, x->seq + 1), and this thread's device. */
static dt_status begin(nccl_ctx *x, const dt_comm_deadline *dl, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static dt_status begin(nccl_ctx *x, const dt_comm_deadline *dl, const char *fmt, ...) {
    flight *f = x->cur = &x->fl[x->seq % N_FLIGHT]; /* free: at most N_FLIGHT in flight (comm.c) */
    f->dl = *dl;
    f->holds_mark = take_mark(x, &f->mark); /* every collective takes its own, in order */
    f->waited = NULL;
    f->t0 = dt_clock_now();
    x->seq++;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->op, sizeof x->op, fmt, ap);
    va_end(ap);
    snprintf(f->op, sizeof f->op, "%s", x->op);
    return thread_setup(x);
}

/* The end of a blocking collective: it has landed (wait_done), or lands now when it had nothing
 * to do; a failure aborts. */
static dt_status blocking_end(nccl_ctx *x, dt_status st) {
    if (st != DT_OK) return failed(x, st);
    if (x->landed < x->seq) land(x, x->cur);
    return DT_OK;
}

/* DT_WIRE_BF16: d(n) rounded into the wire buffer (on our stream, after the staging). The
 * trainer sizes that buffer at start for its largest bucket (nccl_reserve); a caller that did
 * not (a test) has it grown before the wait for the compute stream (a cudaFree now would wait
 * for all of it), by a blocking run. The collectives in flight share it: our stream runs each
 * one's cast, NCCL call and widening before the next one's cast. */
static dt_status to_wire(nccl_ctx *x, const float *d, size_t n) {
    return CK(dtk_cast_bf16, x->stream, x->wire, d, n);
}

/* The NCCL calls of float collective o on d(n) (o->buf itself, or its staged copy), queued on
 * our stream after the wait for the compute stream (and the staging).
 * All-reduce: in place; as bf16 through the wire buffer.
 * Reduce-scatter and all-gather of parts: in place. Parts of one size (n divisible by the
 * world) are NCCL's ncclReduceScatter / ncclAllGather in place; other splits (dt_comm_part's
 * parts differ by one float) a group of one ncclReduce / ncclBroadcast per part, rooted at its
 * owner. A bf16 reduce-scatter travels in the wire buffer; only this rank's part comes back. */
static dt_status float_calls(nccl_ctx *x, const dt_comm_float_op *o, float *d) {
    const size_t n = o->n;
    const int bf = o->wire == DT_WIRE_BF16;
    const ncclDataType_t type = bf ? ncclBfloat16 : ncclFloat32;
    if (bf) DT_TRY(to_wire(x, d, n));
    if (o->kind == DT_COMM_ALLREDUCE) {
        void *v = bf ? x->wire : (void *)d;
        DT_TRY(NC(ncclAllReduce, v, v, n, type, o->op == DT_REDUCE_AVG ? ncclAvg : ncclSum, x->comm, x->stream));
        return bf ? CK(dtk_widen_bf16, x->stream, d, x->wire, n) : DT_OK;
    }
    const int gather = o->kind == DT_COMM_GATHER_PARTS;
    const size_t es = bf ? 2 : sizeof(float);
    char *v = bf ? (char *)x->wire : (char *)d;
    const size_t W = (size_t)x->world;
    size_t lo, hi;
    dt_comm_part(n, x->world, x->rank, &lo, &hi);
    if (n % W == 0) {
        char *mine = v + lo * es;
        if (gather) DT_TRY(NC(ncclAllGather, mine, v, n / W, type, x->comm, x->stream));
        else DT_TRY(NC(ncclReduceScatter, v, mine, n / W, type, ncclSum, x->comm, x->stream));
    } else {
        DT_TRY(ck_nccl(x, nc.ncclGroupStart(), "ncclGroupStart", __FILE__, __LINE__));
        dt_status st = DT_OK;
        for (int q = 0; st == DT_OK && q < x->world; q++) {
            size_t qlo, qhi;
            dt_comm_part(n, x->world, q, &qlo, &qhi);
            char *p = v + qlo * es;
            st = gather ? NC(ncclBroadcast, p, p, qhi - qlo, type, q, x->comm, x->stream)
                        : NC(ncclReduce, p, p, qhi - qlo, type, ncclSum, q, x->comm, x->stream);
        }
        dt_status group_end = ck_nccl(x, nc.ncclGroupEnd(), "ncclGroupEnd", __FILE__, __LINE__); /* closes the group */
        DT_TRY(st);
        DT_TRY(group_end);
    }
    if (bf) DT_TRY(CK(dtk_widen_bf16, x->stream, d + lo, (const dtk_bf16 *)(v + lo * es), hi - lo));
    return DT_OK;
}

/* Blocking: buf(n) used as it is when it is device memory, else staged through the scratch
 * buffer (H2D before the calls, D2H after `done`); the bf16 wire buffer grown before the wait
 * for the compute stream starts (a cudaFree waits for the device). */
static dt_status float_blocking(nccl_ctx *x, const dt_comm_float_op *o) {
    const size_t n = o->n;
    static const char *const what[] = {"all-reduce", "reduce-scatter", "all-gather of parts"};
    if (n > SIZE_MAX / sizeof(float)) return dt_error_set(DT_ERR_INTERNAL, "nccl %s: too large", x->op);
    int dev;
    DT_TRY(classify(x, o->buf, what[o->kind], &dev));
    float *d = o->buf;
    if (!dev) {
        DT_TRY(grow_scratch(x, n * sizeof(float)));
        d = x->scratch;
    }
    if (o->wire == DT_WIRE_BF16) DT_TRY(grow_buf(x, &x->wire, &x->wire_bytes, n * 2, "bf16 buffer"));
    DT_TRY(after_compute(x));
    if (!dev) DT_TRY(CK(cudaMemcpyAsync, d, o->buf, n * sizeof(float), cudaMemcpyHostToDevice, x->stream));
    DT_TRY(float_calls(x, o, d));
    DT_TRY(wait_done(x));
    return dev ? DT_OK : download(x, o->buf, d, n * sizeof(float));
}

/* begin() with the collective's name: "all-reduce #3 (1000 floats, sum, as bf16)" */
static dt_status begin_float(nccl_ctx *x, const dt_comm_float_op *o, const dt_comm_deadline *dl) {
    const char *bf = o->wire == DT_WIRE_BF16 ? ", as bf16" : "";
    if (o->kind == DT_COMM_ALLREDUCE)
        return begin(x, dl, "all-reduce #%lu (%zu floats, %s%s)", x->seq + 1, o->n,
                     o->op == DT_REDUCE_AVG ? "avg" : "sum", bf);
    if (o->kind == DT_COMM_REDUCE_SCATTER) return begin(x, dl, "reduce-scatter #%lu (%zu floats%s)", x->seq + 1, o->n, bf);
    return begin(x, dl, "all-gather of parts #%lu (%zu floats)", x->seq + 1, o->n);
}

static dt_status run_float(nccl_ctx *x, const dt_comm_float_op *o, const dt_comm_deadline *dl) {
    dt_status st = begin_float(x, o, dl);
    if (st == DT_OK && o->n > 0) st = float_blocking(x, o);
    return blocking_end(x, st);
}

static dt_status nccl_allreduce(void *vctx, float *buf, size_t n, dt_reduce_op op, dt_wire wire,
                                const dt_comm_deadline *dl) {
    const dt_comm_float_op o = {DT_COMM_ALLREDUCE, buf, n, op, wire};
    return run_float(vctx, &o, dl);
}

static dt_status nccl_reduce_scatter(void *vctx, float *buf, size_t n, dt_wire wire, const dt_comm_deadline *dl) {
    const dt_comm_float_op o = {DT_COMM_REDUCE_SCATTER, buf, n, DT_REDUCE_SUM, wire};
    return run_float(vctx, &o, dl);
}

static dt_status nccl_allgather_parts(void *vctx, float *buf, size_t n, const dt_comm_deadline *dl) {
    const dt_comm_float_op o = {DT_COMM_GATHER_PARTS, buf, n, DT_REDUCE_SUM, DT_WIRE_F32};
    return run_float(vctx, &o, dl);
}

/* comm.h's issue: float collective o queued behind its mark and the collectives in flight,
 * with its own `done`, not waited for. Declined (run blocking once nothing is in flight): an
 * empty one, host memory (its copy back waits for `done`), memory classify refuses (the
 * blocking run says why), a bf16 buffer to grow (cudaFree waits for the device), and anything
 * before this thread has made the device current (its first collective). */
static dt_status nccl_issue(void *vctx, const dt_comm_float_op *o, const dt_comm_deadline *dl, int *issued) {
    nccl_ctx *x = vctx;
    *issued = 0;
    if (!x->thread_ready || o->n == 0 || o->n > SIZE_MAX / sizeof(float) || x->seq - x->landed >= N_FLIGHT ||
        (o->wire == DT_WIRE_BF16 && x->wire_bytes < o->n * 2))
        return DT_OK;
    int dev = 0;
    if (classify(x, o->buf, "bucket", &dev) != DT_OK || !dev) {
        dt_error_clear();
        return DT_OK;
    }
    dt_status st = begin_float(x, o, dl);
    if (st == DT_OK) st = after_compute(x);
    if (st == DT_OK) st = float_calls(x, o, o->buf);
    if (st == DT_OK) st = CK(cudaEventRecord, x->cur->done, x->stream);
    if (st != DT_OK) return failed(x, st);
    *issued = 1;
    return DT_OK;
}

/* comm.h's poll: one look at the oldest collective in flight. */
static dt_status nccl_poll(void *vctx, int *done) {
    nccl_ctx *x = vctx;
    *done = 0;
    if (x->landed == x->seq) return dt_error_set(DT_ERR_INTERNAL, "nccl rank %d: poll with nothing in flight", x->rank);
    flight *f = &x->fl[x->landed % N_FLIGHT];
    snprintf(x->op, sizeof x->op, "%s", f->op); /* the messages name it */
    dt_status st = look(x, f, done);
    if (st != DT_OK) return failed(x, st);
    if (*done) land(x, f);
    else nap(f);
    return DT_OK;
}

static double nccl_exposed_ms(void *vctx) {
    nccl_ctx *x = vctx;
    pthread_mutex_lock(&x->marks_mu);
    const double v = x->exposed_ms;
    pthread_mutex_unlock(&x->marks_mu);
    return v;
}

/* dt_comm_allreduce_bf16: summed by NCCL as bf16, in place on the device (host memory staged
 * through the scratch buffer, as broadcast_ stages it) */
static dt_status allreduce_bf16_(nccl_ctx *x, uint16_t *buf, size_t n) {
    if (n > SIZE_MAX / 2) return dt_error_set(DT_ERR_INTERNAL, "nccl %s: too large", x->op);
    int dev;
    DT_TRY(classify(x, buf, "bf16 all-reduce", &dev));
    void *d = buf;
    if (!dev) {
        DT_TRY(grow_scratch(x, n * 2));
        d = x->scratch;
    }
    DT_TRY(after_compute(x));
    if (!dev) DT_TRY(CK(cudaMemcpyAsync, d, buf, n * 2, cudaMemcpyHostToDevice, x->stream));
    DT_TRY(NC(ncclAllReduce, d, d, n, ncclBfloat16, ncclSum, x->comm, x->stream));
    DT_TRY(wait_done(x));
    return dev ? DT_OK : download(x, buf, d, n * 2);
}

static dt_status nccl_allreduce_bf16(void *vctx, uint16_t *buf, size_t n, const dt_comm_deadline *dl) {
    nccl_ctx *x = vctx;
    dt_status st = begin(x, dl, "all-reduce #%lu (%zu bf16 values, sum)", x->seq + 1, n);
    if (st == DT_OK && n > 0) st = allreduce_bf16_(x, buf, n);
    return blocking_end(x, st);
}

static dt_status broadcast_(nccl_ctx *x, void *buf, size_t bytes, int root) {
    int dev;
    DT_TRY(classify(x, buf, "broadcast", &dev));
    void *d = buf;
    if (!dev) {
        DT_TRY(grow_scratch(x, bytes));
        d = x->scratch;
    }
    DT_TRY(after_compute(x));
    if (!dev && x->rank == root) DT_TRY(CK(cudaMemcpyAsync, d, buf, bytes, cudaMemcpyHostToDevice, x->stream));
    DT_TRY(NC(ncclBroadcast, d, d, bytes, ncclUint8, root, x->comm, x->stream));
    DT_TRY(wait_done(x));
    if (!dev) DT_TRY(download(x, buf, d, bytes));
    return DT_OK;
}

static dt_status nccl_broadcast(void *vctx, void *buf, size_t bytes, int root, const dt_comm_deadline *dl) {
    nccl_ctx *x = vctx;
    dt_status st = begin(x, dl, "broadcast #%lu (%zu bytes from rank %d)", x->seq + 1, bytes, root);
    if (st == DT_OK && bytes > 0) st = broadcast_(x, buf, bytes, root);
    return blocking_end(x, st);
}

static dt_status allgather_(nccl_ctx *x, const void *in, size_t bytes, void *out) {
    if (bytes > SIZE_MAX / 2 / (size_t)x->world) return dt_error_set(DT_ERR_INTERNAL, "nccl %s: too large", x->op);
    const size_t out_bytes = bytes * (size_t)x->world;
    int in_dev, out_dev;
    DT_TRY(classify(x, in, "all-gather input", &in_dev));
    DT_TRY(classify(x, out, "all-gather output", &out_dev));
    /* NCCL allows in == out + rank * bytes (in place) or disjoint buffers; anything else on
     * the device is copied aside first, like host input */
    const char *i0 = in, *o0 = out;
    int overlap = in_dev && out_dev && i0 < o0 + out_bytes && o0 < i0 + bytes && i0 != o0 + (size_t)x->rank * bytes;
    int stage_in = !in_dev || overlap;
    size_t need = out_dev ? 0 : out_bytes, in_off = 0;
    if (stage_in) {
        in_off = (need + 255) & ~(size_t)255;
        need = in_off + bytes;
    }
    if (need) DT_TRY(grow_scratch(x, need));
    char *s = x->scratch;
    const void *din = stage_in ? (const void *)(s + in_off) : in;
    void *dout = out_dev ? out : (void *)s;
    DT_TRY(after_compute(x));
    if (stage_in)
        DT_TRY(CK(cudaMemcpyAsync, (void *)din, in, bytes, in_dev ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice,
                  x->stream));
    DT_TRY(NC(ncclAllGather, din, dout, bytes, ncclUint8, x->comm, x->stream));
    DT_TRY(wait_done(x));
    if (!out_dev) DT_TRY(download(x, out, dout, out_bytes));
    return DT_OK;
}

static dt_status nccl_allgather(void *vctx, const void *in, size_t bytes, void *out, const dt_comm_deadline *dl) {
    nccl_ctx *x = vctx;
    dt_status st = begin(x, dl, "all-gather #%lu (%zu bytes per rank)", x->seq + 1, bytes);
    if (st == DT_OK && bytes > 0) st = allgather_(x, in, bytes, out);
    return blocking_end(x, st);
}

/* dt_comm_reserve: the bf16 wire buffer for `floats`, now, so that no bucket of a step grows it
 * (growing frees the old one: cudaFree waits for the whole device, the compute stream too) */
static dt_status nccl_reserve(void *vctx, size_t floats) {
    nccl_ctx *x = vctx;
    snprintf(x->op, sizeof x->op, "reserve (%zu floats as bf16)", floats);
    dt_status st = thread_setup(x);
    if (st == DT_OK && floats > SIZE_MAX / 2) st = dt_error_set(DT_ERR_INTERNAL, "nccl %s: too large", x->op);
    if (st == DT_OK && floats) st = grow_buf(x, &x->wire, &x->wire_bytes, floats * 2, "bf16 buffer");
    x->op[0] = '\0';
    return st;
}

/* An all-reduce of one float in the scratch buffer. It orders host threads, not GPU work:
 * it does not wait for the compute stream. */
static dt_status nccl_barrier(void *vctx, const dt_comm_deadline *dl) {
    nccl_ctx *x = vctx;
    dt_status st = begin(x, dl, "barrier #%lu", x->seq + 1); /* its deadline counts from here */
    if (st == DT_OK) st = NC(ncclAllReduce, x->scratch, x->scratch, 1, ncclFloat32, ncclSum, x->comm, x->stream);
    if (st == DT_OK) st = wait_done(x);
    return blocking_end(x, st);
}

/* Runs on the thread that calls dt_comm_free (or dt_comm_init_nccl on failure), after the
 * communicator's thread has finished every queued collective. */
static void nccl_free(void *vctx) {
    nccl_ctx *x = vctx;
    if (!x) return;
    if (x->marks_mu_ok) pthread_mutex_destroy(&x->marks_mu);
    if (!x->comm && !x->stream && !x->fl[0].ready && !x->marks[0] && !x->scratch) { /* made no CUDA state */
        free(x);
        return;
    }
    int prev = -1;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    (void)cudaSetDevice(x->device);
    if (x->comm) {
        /* healthy: nothing of ours is in flight, and ncclCommDestroy waits (an intra-host
         * barrier in recent NCCL) until every rank on this host lets go of the connections;
         * after a failure it could wait for a dead peer: abort instead */
        if (x->failed) nc.ncclCommAbort(x->comm);
        else nc.ncclCommDestroy(x->comm);
        x->comm = NULL;
    }
    if (x->stream) cudaStreamDestroy(x->stream); /* pending work, if any, still completes */
    for (int i = 0; i < N_FLIGHT; i++) {
        if (x->fl[i].ready) cudaEventDestroy(x->fl[i].ready);
        if (x->fl[i].done) cudaEventDestroy(x->fl[i].done);
    }
    for (int i = 0; i < N_MARKS; i++)
        if (x->marks[i]) cudaEventDestroy(x->marks[i]);
    if (x->scratch) cudaFree(x->scratch);
    if (x->wire) cudaFree(x->wire);
    (void)cudaGetLastError();
    if (prev >= 0 && prev != x->device) (void)cudaSetDevice(prev);
    free(x);
}

static const dt_comm_backend_ops nccl_backend = {
    .name = "nccl",
    .allreduce = nccl_allreduce,
    .allreduce_bf16 = nccl_allreduce_bf16,
    .broadcast = nccl_broadcast,
    .allgather = nccl_allgather,
    .reduce_scatter = nccl_reduce_scatter,
    .allgather_parts = nccl_allgather_parts,
    .barrier = nccl_barrier,
    .free = nccl_free,
    .prepare = nccl_prepare,
    .reserve = nccl_reserve,
    .max_in_flight = N_FLIGHT,
    .issue = nccl_issue,
    .poll = nccl_poll,
    .exposed_ms = nccl_exposed_ms,
};

/* This rank's part that needs no other rank: the library, the device, our stream, events,
 * the scratch buffer, and on rank 0 the unique id. */
static dt_status local_setup(nccl_ctx *x, ncclUniqueId *id) {
    if (pthread_mutex_init(&x->marks_mu, NULL) != 0)
        return dt_error_set(DT_ERR_INTERNAL, "nccl: rank %d (host %s): pthread_mutex_init failed", x->rank, x->host);
    x->marks_mu_ok = 1;
    pthread_once(&nc_once, nc_load);
    if (nc_error[0]) return dt_error_set(DT_ERR_DEVICE, "nccl: rank %d (host %s): %s", x->rank, x->host, nc_error);
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || x->device < 0 || x->device >= count) {
        const char *vis = getenv("CUDA_VISIBLE_DEVICES");
        (void)cudaGetLastError();
        return dt_error_set(DT_ERR_DEVICE, "nccl: rank %d (host %s): GPU %d is not usable: %s (CUDA_VISIBLE_DEVICES=%s)",
                            x->rank, x->host, x->device, e != cudaSuccess ? cudaGetErrorString(e) :
                            "fewer GPUs are visible", vis ? vis : "unset");
    }
    DT_TRY(CK(cudaSetDevice, x->device));
    DT_TRY(CK(cudaStreamCreateWithFlags, &x->stream, cudaStreamNonBlocking));
    /* with timing: a collective's exposed time is the time from its mark (or ready) to its done */
    for (int i = 0; i < N_FLIGHT; i++) {
        DT_TRY(CK(cudaEventCreateWithFlags, &x->fl[i].ready, cudaEventDefault));
        DT_TRY(CK(cudaEventCreateWithFlags, &x->fl[i].done, cudaEventDefault));
    }
    for (int i = 0; i < N_MARKS; i++) DT_TRY(CK(cudaEventCreateWithFlags, &x->marks[i], cudaEventDefault));
    DT_TRY(grow_scratch(x, SCRATCH_MIN));
    if (x->rank == 0) DT_TRY(NC(ncclGetUniqueId, id));
    return DT_OK;
}

dt_status dt_comm_init_nccl(dt_comm **out, dt_comm *boot, int device, void *compute_stream, double timeout_s) {
    *out = NULL;
    if (!boot) return dt_error_set(DT_ERR_INTERNAL, "nccl: no bootstrap communicator");
    const int rank = dt_comm_rank(boot), world = dt_comm_world(boot);
    /* the same on every rank (configuration): all ranks fail here, none waits in boot */
    if (!(timeout_s > 0))
        return dt_error_set(DT_ERR_CONFIG, "nccl communicator: training.collective_timeout_s must be > 0 (got %g)",
                            timeout_s);
    char host[64];
    if (gethostname(host, sizeof host) != 0) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = '\0';
    int32_t *ok = dt_calloc((size_t)world, sizeof *ok, "nccl setup flags");
    nccl_ctx *x = ok ? dt_calloc(1, sizeof *x, "nccl communicator") : NULL;
    if (!x) { /* the other ranks fail at boot's deadline, naming this one */
        free(ok);
        return DT_ERR_NOMEM;
    }
    x->rank = rank;
    x->world = world;
    x->device = device;
    x->compute = (cudaStream_t)compute_stream;
    x->exposed_ms = NAN;
    memcpy(x->host, host, sizeof host);

    /* This rank's part; the communicator (and its thread) is made here too, so that its
     * failure is reported like the others. Its thread touches `x` only for a collective,
     * and none can be queued before this function returns. */
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    dt_comm *c = NULL;
    dt_status local = local_setup(x, &id);
    if (local == DT_OK && (local = dt_comm_create(&c, &nccl_backend, x, rank, world, timeout_s)) != DT_OK)
        x = NULL; /* dt_comm_create freed it */
    char local_msg[2048] = "";
    if (local != DT_OK) snprintf(local_msg, sizeof local_msg, "%s", dt_error_msg());

    /* every rank learns whether every rank is ready before anyone waits in NCCL's init */
    int32_t mine = local == DT_OK;
    dt_status st = dt_comm_allgather(boot, &mine, sizeof mine, ok);
    char bad[256] = "";
    size_t k = 0;
    if (st != DT_OK) {
        dt_error_prefix("nccl: rank %d (host %s): exchanging the setup status over the %s communicator", rank, host,
                        dt_comm_backend(boot));
        goto fail;
    }
    if (local != DT_OK) {
        st = dt_error_set(local, "%s", local_msg);
        goto fail;
    }
    for (int r = 0; r < world; r++)
        if (!ok[r] && k < sizeof bad) k += (size_t)snprintf(bad + k, sizeof bad - k, "%s%d", k ? ", " : "", r);
    if (k) {
        st = dt_error_set(DT_ERR_DEVICE, "nccl: rank(s) %s could not set up NCCL (their own messages say why); rank %d "
                          "(host %s) stops too", bad, rank, host);
        goto fail;
    }
    st = dt_comm_broadcast(boot, &id, sizeof id, 0);
    if (st != DT_OK) {
        dt_error_prefix("nccl: rank %d (host %s): receiving the NCCL unique id over the %s communicator", rank, host,
                        dt_comm_backend(boot));
        goto fail;
    }
    /* Blocking init (no NCCL-side timeout): every rank has just shown it is alive and ready,
     * so only a rank that dies or hangs inside ncclCommInitRank can hold the others here. In
     * fork mode the launcher kills all workers when one dies; under an external launcher
     * (mpirun, torchrun, a Kubernetes Job) its failure policy applies. A non-blocking init
     * (config.blocking = 0) polled against the deadline would cover even that, at the price
     * of ncclInProgress handling in every call. */
    snprintf(x->op, sizeof x->op, "init (%d ranks)", world);
    ncclComm_t comm = NULL;
    ncclResult_t r = nc.ncclCommInitRank(&comm, world, id, rank);
    if (r != ncclSuccess) {
        st = nccl_fail(x, r, "ncclCommInitRank", __FILE__, __LINE__);
        if (comm) nc.ncclCommAbort(comm); /* recent NCCL leaves a failed blocking comm to be freed */
        goto fail;
    }
    x->comm = comm;
    x->op[0] = '\0';
    free(ok);
    *out = c;
    return DT_OK;
fail:
    free(ok);
    if (c) {
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", dt_error_msg());
        dt_comm_free(c); /* joins the idle thread, then nccl_free(x) */
        dt_error_set(st, "%s", msg);
    } else if (x) {
        nccl_free(x);
    }
    return st;
}
