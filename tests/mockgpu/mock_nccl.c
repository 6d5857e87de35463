/* mock_nccl.c — libnccl.so.2 (src/comm/comm_nccl.c finds it with dlopen): a one-rank NCCL on the
 * stream model of mock_cuda.c, for tests/test_comm_nccl.c.
 *
 * Modelled, and checked:
 *   - ncclGetVersion: the version code of the nccl.h it is built against (2.13 or newer is
 *     what comm_nccl.c needs); ncclGetUniqueId makes ids that ncclCommInitRank recognises: an
 *     id it did not make (not passed on from rank 0, zeros) is an error.
 *   - ncclCommInitRank: one rank only (nranks 1, rank 0); more is reported, since no other
 *     rank could ever join (the mock has no transport between processes).
 *   - ncclAllReduce (sum, prod, max, min, avg), ncclBroadcast, ncclAllGather, ncclReduceScatter,
 *     ncclReduce: over one rank
 *     each is a copy of the input to the output (avg divides by 1: bit for bit the input),
 *     queued as stream work on the given stream, so it runs after what was queued there before
 *     and before what comes after (cudaEventRecord, cudaStreamWaitEvent, synchronisation see
 *     it as they would see a kernel). Arguments are checked as NCCL documents them: device (or
 *     managed) memory for both buffers, each inside one allocation (pinned or pageable host
 *     memory, an overrun, NULL: errors), a known datatype and op, root 0, in place or
 *     disjoint buffers (all-gather in place: sendbuff == recvbuff + rank * sendcount).
 *   - ncclCommAbort: queued collectives of the communicator do nothing when their stream gets
 *     to them, and a running one stops at its next 16 MiB chunk; the abort returns once none
 *     runs (as NCCL's abort stops its kernels). ncclCommDestroy waits until every queued
 *     collective of the communicator has run (NCCL's finalize). Either frees it: any later
 *     use, and a second destroy or abort, is reported, and so is a communicator still alive
 *     when the process exits with status 0.
 *   - ncclCommGetAsyncError: ncclSuccess (no peer can fail); ncclGetErrorString for every
 *     result; ncclGetLastError: the message of the mock's last failed call.
 * For tests (not NCCL's API): mock_nccl_queued_now() counts the collectives queued on their
 * streams and not yet run, mock_nccl_max_queued() the most of one communicator at once since its
 * last call (more than 1: the caller issued the next before the one before had completed, so
 * before it could have seen it done); MOCK_NCCL_LOG=FILE appends a line "CALL DATATYPE COUNT
 * QUEUED" for every collective issued, QUEUED counting it and the ones of its communicator
 * still queued before it (e.g. "ncclAllReduce ncclBfloat16 10272 2").
 * Every problem is printed as "MOCK ERROR: ..." (mock_report) and makes the process exit 1.
 *
 * Not modelled: more than one rank (no data exchange, no reduction arithmetic, no peer that
 * dies or hangs: the asynchronous error path and NCCL's own timeouts), real NCCL timing (a
 * collective costs a host memmove here, not a kernel and a network), groups (beyond checking
 * that ncclGroupStart and ncclGroupEnd pair up), non-blocking
 * communicators (ncclInProgress), user buffer registration, ncclMemAlloc. */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mock_api.h"

#define CHUNK ((size_t)16 << 20) /* a running collective looks for an abort between chunks */
#define ID_MAGIC "dtrain-mock-nccl-id"

struct ncclComm {
    int nranks, rank;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int aborted;            /* queued work does nothing, running work stops */
    int freed;              /* destroyed or aborted: any later use is an error */
    int running;            /* collectives copying right now (0 or 1: one stream each) */
    unsigned long pending;  /* queued and not yet run */
    unsigned long max_pending; /* the most at any time since mock_nccl_max_queued last read it */
    unsigned long seq;      /* collectives issued, for messages */
    struct ncclComm *next;
};

static pthread_mutex_t comms_mu = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *comms;   /* every communicator made (never released: use after free is found) */
static unsigned long ids_made;
static char last_error[512];
static FILE *call_log;           /* MOCK_NCCL_LOG, opened at the first collective */

static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t fail(ncclResult_t r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&comms_mu);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    pthread_mutex_unlock(&comms_mu);
    va_end(ap);
    return r;
}
/* a misuse of the API (not a runtime failure NCCL could have): reported, then returned */
#define MISUSE(r, ...) (mock_report("NCCL: " __VA_ARGS__), fail(r, __VA_ARGS__))

/* comm, if it is a live communicator made here; else reported, NULL */
static struct ncclComm *live(ncclComm_t comm, const char *call) {
    struct ncclComm *c = NULL;
    pthread_mutex_lock(&comms_mu);
    for (struct ncclComm *k = comms; k; k = k->next)
        if (k == comm) c = k;
    pthread_mutex_unlock(&comms_mu);
    if (!c) {
        mock_report("NCCL: %s: %p is not a communicator made by ncclCommInitRank", call, (void *)comm);
        fail(ncclInvalidArgument, "%s: invalid communicator", call);
        return NULL;
    }
    if (__atomic_load_n(&c->freed, __ATOMIC_SEQ_CST)) {
        mock_report("NCCL: %s: communicator %p was already destroyed or aborted (use after free)", call, (void *)c);
        fail(ncclInvalidArgument, "%s: invalid communicator", call);
        return NULL;
    }
    return c;
}

/* at a successful exit (after a failure, the leak is not news) */
static void check_leaks(int status, void *arg) {
    (void)arg;
    if (status != 0) return;
    int n = 0;
    pthread_mutex_lock(&comms_mu);
    for (struct ncclComm *k = comms; k; k = k->next) n += !k->freed;
    pthread_mutex_unlock(&comms_mu);
    if (!n) return;
    mock_report("NCCL: %d communicator(s) never destroyed or aborted", n);
    /* exit 1 here: libmockcuda's summary may have run already (when linked, not dlopen'ed) */
    fprintf(stderr, "MOCK: exiting 1\n");
    fflush(NULL);
    _exit(1);
}
__attribute__((constructor)) static void mock_nccl_init(void) { on_exit(check_leaks, NULL); }

/* ---------------------------------------------------------------- setup */

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return MISUSE(ncclInvalidArgument, "ncclGetVersion: NULL version");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return MISUSE(ncclInvalidArgument, "ncclGetUniqueId: NULL id");
    memset(id, 0, sizeof *id);
    pthread_mutex_lock(&comms_mu);
    unsigned long k = ++ids_made;
    pthread_mutex_unlock(&comms_mu);
    snprintf(id->internal, sizeof id->internal, "%s %ld %lu", ID_MAGIC, (long)getpid(), k);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return MISUSE(ncclInvalidArgument, "ncclCommInitRank: NULL comm");
    *comm = NULL;
    char want[sizeof id.internal];
    snprintf(want, sizeof want, "%s %ld ", ID_MAGIC, (long)getpid());
    if (strncmp(id.internal, want, strlen(want)) != 0)
        return MISUSE(ncclInvalidArgument, "ncclCommInitRank: the unique id was not made by ncclGetUniqueId "
                      "(not passed on from rank 0?)");
    if (nranks != 1 || rank != 0)
        return MISUSE(ncclInvalidUsage, "ncclCommInitRank: nranks %d, rank %d: the mock models one rank only "
                      "(nranks 1, rank 0)", nranks, rank);
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || dev != 0)
        return MISUSE(ncclInvalidUsage, "ncclCommInitRank: no usable current CUDA device (%d)", dev);
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) return fail(ncclSystemError, "ncclCommInitRank: out of memory");
    c->nranks = nranks;
    c->rank = rank;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_lock(&comms_mu);
    c->next = comms;
    comms = c;
    pthread_mutex_unlock(&comms_mu);
    *comm = c;
    return ncclSuccess;
}

/* NCCL accepts NULL for both (nothing to do) */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    struct ncclComm *c = live(comm, "ncclCommDestroy");
    if (!c) return ncclInvalidArgument;
    pthread_mutex_lock(&c->mu);
    while (c->pending) pthread_cond_wait(&c->cv, &c->mu); /* finalize: the queued work completes */
    __atomic_store_n(&c->freed, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&c->mu);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    struct ncclComm *c = live(comm, "ncclCommAbort");
    if (!c) return ncclInvalidArgument;
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&c->aborted, 1, __ATOMIC_SEQ_CST);
    while (c->running) pthread_cond_wait(&c->cv, &c->mu); /* the running copy stops at its next chunk */
    __atomic_store_n(&c->freed, 1, __ATOMIC_SEQ_CST);
    pthread_mutex_unlock(&c->mu);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    if (!live(comm, "ncclCommGetAsyncError")) return ncclInvalidArgument;
    if (!asyncError) return MISUSE(ncclInvalidArgument, "ncclCommGetAsyncError: NULL result");
    *asyncError = ncclSuccess; /* one rank: no peer or network to fail */
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r) {
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

/* NULL comm: the last error of any call, as NCCL allows */
const char *ncclGetLastError(ncclComm_t comm) {
    (void)comm;
    return last_error;
}

/* ---------------------------------------------------------------- collectives */

static size_t type_size(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
    }
}

static const char *type_name(ncclDataType_t t) {
    switch (t) {
    case ncclInt8: return "ncclInt8";
    case ncclUint8: return "ncclUint8";
    case ncclFloat16: return "ncclFloat16";
    case ncclBfloat16: return "ncclBfloat16";
    case ncclInt32: return "ncclInt32";
    case ncclUint32: return "ncclUint32";
    case ncclFloat32: return "ncclFloat32";
    case ncclInt64: return "ncclInt64";
    case ncclUint64: return "ncclUint64";
    case ncclFloat64: return "ncclFloat64";
    default: return "?";
    }
}

/* MOCK_NCCL_LOG: one line per collective issued */
static void log_call(const char *call, ncclDataType_t type, size_t count, unsigned long queued) {
    const char *path = getenv("MOCK_NCCL_LOG");
    if (!path || !path[0]) return;
    pthread_mutex_lock(&comms_mu);
    if (!call_log && !(call_log = fopen(path, "a"))) mock_report("NCCL: cannot open MOCK_NCCL_LOG %s", path);
    if (call_log) {
        fprintf(call_log, "%s %s %zu %lu\n", call, type_name(type), count, queued);
        fflush(call_log);
    }
    pthread_mutex_unlock(&comms_mu);
}

/* the collectives of every communicator queued now and not yet run */
unsigned long mock_nccl_queued_now(void) {
    unsigned long n = 0;
    pthread_mutex_lock(&comms_mu);
    for (struct ncclComm *k = comms; k; k = k->next) {
        pthread_mutex_lock(&k->mu);
        n += k->pending;
        pthread_mutex_unlock(&k->mu);
    }
    pthread_mutex_unlock(&comms_mu);
    return n;
}

/* the most collectives of one communicator queued at once since the last call, then reset */
unsigned long mock_nccl_max_queued(void) {
    unsigned long most = 0;
    pthread_mutex_lock(&comms_mu);
    for (struct ncclComm *k = comms; k; k = k->next) {
        pthread_mutex_lock(&k->mu);
        if (k->max_pending > most) most = k->max_pending;
        k->max_pending = k->pending;
        pthread_mutex_unlock(&k->mu);
    }
    pthread_mutex_unlock(&comms_mu);
    return most;
}

typedef struct job { struct ncclComm *c; void *dst; const void *src; size_t bytes; } job;

/* on the stream's thread, in stream order */
static void run_job(void *arg) {
    job *j = arg;
    struct ncclComm *c = j->c;
    pthread_mutex_lock(&c->mu);
    const int go = !c->aborted;
    c->running += go;
    pthread_mutex_unlock(&c->mu);
    if (go && j->dst != j->src)
        for (size_t off = 0; off < j->bytes && !__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST); off += CHUNK)
            memmove((char *)j->dst + off, (const char *)j->src + off, j->bytes - off < CHUNK ? j->bytes - off : CHUNK);
    pthread_mutex_lock(&c->mu);
    c->running -= go;
    c->pending--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    free(j);
}

/* The checks every collective shares, then the copy of `bytes` from send to recv queued on
 * the stream. recv_bytes: the output's size; in_place_off: where sendbuff may sit in recvbuff. */
static ncclResult_t collective(const char *call, const void *send, void *recv, size_t count, ncclDataType_t type,
                               size_t recv_count, size_t in_place_off, ncclComm_t comm, cudaStream_t stream) {
    struct ncclComm *c = live(comm, call);
    if (!c) return ncclInvalidArgument;
    const size_t ts = type_size(type);
    if (!ts) return MISUSE(ncclInvalidArgument, "%s: unknown datatype %d", call, (int)type);
    if (recv_count > SIZE_MAX / ts) return MISUSE(ncclInvalidArgument, "%s: count %zu too large", call, count);
    if (count == 0) {
        log_call(call, type, count, 0);
        return ncclSuccess; /* NCCL: nothing to do, no pointer is looked at */
    }
    const size_t bytes = count * ts, recv_bytes = recv_count * ts;
    char what[128];
    snprintf(what, sizeof what, "%s sendbuff (%zu bytes)", call, bytes);
    if (mock_check_dev_range(send, bytes, what))
        return fail(ncclInvalidArgument, "%s: sendbuff is not device memory or too small", call);
    snprintf(what, sizeof what, "%s recvbuff (%zu bytes)", call, recv_bytes);
    if (mock_check_dev_range(recv, recv_bytes, what))
        return fail(ncclInvalidArgument, "%s: recvbuff is not device memory or too small", call);
    const char *s = send, *r = recv;
    if (s < r + recv_bytes && r < s + bytes && s != r + in_place_off * ts)
        return MISUSE(ncclInvalidArgument, "%s: sendbuff %p and recvbuff %p overlap without being in place (NCCL's "
                      "result is undefined)", call, (const void *)s, (void *)r);
    job *j = malloc(sizeof *j);
    if (!j) return fail(ncclSystemError, "%s: out of memory", call);
    *j = (job){c, (char *)recv + in_place_off * ts, send, bytes};
    pthread_mutex_lock(&c->mu);
    const unsigned long queued = ++c->pending;
    if (c->pending > c->max_pending) c->max_pending = c->pending;
    c->seq++;
    pthread_mutex_unlock(&c->mu);
    log_call(call, type, count, queued);
    mock_enqueue_fn(stream, call, run_job, j);
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    if (op != ncclSum && op != ncclProd && op != ncclMax && op != ncclMin && op != ncclAvg)
        return MISUSE(ncclInvalidArgument, "ncclAllReduce: unknown reduction op %d", (int)op);
    /* one rank: sum, prod, max, min of one value and avg over 1 are the value */
    return collective("ncclAllReduce", sendbuff, recvbuff, count, datatype, count, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    struct ncclComm *c = live(comm, "ncclBroadcast");
    if (!c) return ncclInvalidArgument;
    if (root < 0 || root >= c->nranks)
        return MISUSE(ncclInvalidArgument, "ncclBroadcast: root %d of %d rank(s)", root, c->nranks);
    return collective("ncclBroadcast", sendbuff, recvbuff, count, datatype, count, 0, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    struct ncclComm *c = live(comm, "ncclAllGather");
    if (!c) return ncclInvalidArgument;
    return collective("ncclAllGather", sendbuff, recvbuff, sendcount, datatype, sendcount * (size_t)c->nranks,
                      sendcount * (size_t)c->rank, comm, stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    if (op != ncclSum && op != ncclProd && op != ncclMax && op != ncclMin && op != ncclAvg)
        return MISUSE(ncclInvalidArgument, "ncclReduceScatter: unknown reduction op %d", (int)op);
    struct ncclComm *c = live(comm, "ncclReduceScatter");
    if (!c) return ncclInvalidArgument;
    /* one rank: its part is the whole input (in place: recvbuff == sendbuff + rank * recvcount) */
    return collective("ncclReduceScatter", sendbuff, recvbuff, recvcount, datatype, recvcount, 0, comm, stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    if (op != ncclSum && op != ncclProd && op != ncclMax && op != ncclMin && op != ncclAvg)
        return MISUSE(ncclInvalidArgument, "ncclReduce: unknown reduction op %d", (int)op);
    struct ncclComm *c = live(comm, "ncclReduce");
    if (!c) return ncclInvalidArgument;
    if (root < 0 || root >= c->nranks)
        return MISUSE(ncclInvalidArgument, "ncclReduce: root %d of %d rank(s)", root, c->nranks);
    return collective("ncclReduce", sendbuff, recvbuff, count, datatype, count, 0, comm, stream);
}

/* Groups: with one rank, the calls inside run as they are issued; the nesting is checked. */
static __thread int group_depth;

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return MISUSE(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    group_depth--;
    return ncclSuccess;
}
