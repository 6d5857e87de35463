/* mock_nccl.c — libnccl.so.2 (src/comm/comm_nccl.c finds it with dlopen): an NCCL of one or
 * several ranks, one process each (dtrain forks a worker per GPU), on the stream model of
 * mock_cuda.c, for tests/test_comm_nccl.c (one rank) and tests/mockgpu/test_nccl_ranks.c
 * (2 to 4 ranks).
 *
 * Modelled, and checked:
 *   - ncclGetVersion: the version code of the nccl.h it is built against (2.13 or newer is
 *     what comm_nccl.c needs). ncclGetUniqueId makes an id naming a POSIX shared-memory region
 *     ("/dtrain-mock-nccl.PID.K.RANDOM": two runs never collide) that only ncclCommInitRank
 *     creates (an id never used leaves nothing behind); an id ncclCommInitRank does not
 *     recognise (zeros, not passed on from rank 0) is an error.
 *   - ncclCommInitRank(comm, nranks, id, rank): 1 <= nranks <= 256, 0 <= rank < nranks, a
 *     current CUDA device (cudaSetDevice: MOCK_DEVICE_COUNT devices) on the calling thread.
 *     One rank: no region, nothing shared. Several: the first rank to arrive creates the
 *     region (O_CREAT | O_EXCL; the others open it and wait until it is initialised), every
 *     rank joins it, and the call returns once all nranks have joined (a blocking init, as
 *     NCCL's), or fails with ncclSystemError and a report after 120 s (MOCK_NCCL_INIT_TIMEOUT_S)
 *     naming the ranks that never came. The same rank joining twice, ranks that disagree on
 *     nranks, and two ranks on one CUDA device (NCCL's "Duplicate GPU detected") are
 *     reported (a process that joins after all nranks have: its own region, and the timeout).
 *     Once all have joined the region's name is unlinked (the mappings stay), so nothing is
 *     left in /dev/shm, even after a crash.
 *   - ncclAllReduce (sum, prod, max, min, avg), ncclBroadcast, ncclAllGather, ncclReduceScatter,
 *     ncclReduce: queued as stream work on the given stream, so each runs after what was queued
 *     there before and before what comes after (cudaEventRecord, cudaStreamWaitEvent,
 *     synchronisation see it as they would see a kernel), in issue order per communicator.
 *     With one rank each is a copy of the input to the output (avg divides by 1: bit for bit
 *     the input). With several the data goes through the region, in steps of a 2 MiB slot per
 *     rank: each rank copies its input's next piece into its slot, all meet at a barrier, each
 *     computes its output's piece from all the slots, all meet again. Reductions run in rank
 *     order 0, 1, ..., n-1, so every rank gets the same bits: floats and doubles in their own
 *     arithmetic, halves and bf16 through float with every partial result rounded back to
 *     nearest-even (as NCCL's kernels on GPUs without native 16-bit arithmetic), integers
 *     wrapping; avg as NCCL does it: floating types multiply every input by 1/n (in the type)
 *     before summing, integer types divide the sum. Broadcast: the root's input to every
 *     rank's output; all-gather: rank r's sendcount elements at r * sendcount; reduce-scatter:
 *     rank r gets the reduction of part r; reduce: the result at the root only (the other
 *     ranks' recvbuff is not written). Every rank must issue the same collectives with the same
 *     datatype, count, op and root in the same order: a mismatch is reported (real NCCL hangs
 *     or corrupts), and so are two collectives of one communicator running at once (issued on
 *     two streams without ordering).
 *     Arguments are checked as NCCL documents them: device (or managed) memory for both
 *     buffers, each inside one allocation (pinned or pageable host memory, an overrun, NULL:
 *     errors), a known datatype and op, a root of the communicator, in place or disjoint
 *     buffers (all-gather in place: sendbuff == recvbuff + rank * sendcount; reduce-scatter in
 *     place: recvbuff == sendbuff + rank * recvcount).
 *   - ncclCommAbort: queued collectives of the communicator do nothing when their stream gets
 *     to them, and a running one stops at its next 16 MiB chunk (one rank) or leaves its
 *     barrier wait at once (several); the abort returns once none runs (as NCCL's abort stops
 *     its kernels). The other ranks' collectives then wait for the aborted one for ever, as
 *     NCCL's do for a peer that is gone, until their own deadline aborts them. ncclCommDestroy
 *     waits until every queued collective of the communicator has run (NCCL's finalize).
 *     Either frees it: any later use, and a second destroy or abort, is reported, and so is a
 *     communicator still alive when the process exits with status 0.
 *   - a peer that dies: a collective waiting for a rank whose process has exited (recorded at
 *     join; kill(pid, 0) fails with ESRCH, or it is a zombie) notices within about a second,
 *     and from then on ncclCommGetAsyncError answers ncclRemoteError for the communicator; the
 *     collective stops exchanging but stays unfinished on its stream (as an NCCL kernel whose
 *     peer is gone: what comes after it on the stream must not run as if it had completed)
 *     until ncclCommAbort stops it. An aborted peer is not dead: it is waited for.
 *     ncclGetErrorString for every result; ncclGetLastError: the message of the mock's last
 *     failed call, or the dead peer's rank and process.
 *   - ncclGroupStart / ncclGroupEnd pair up; the collectives inside run in issue order, each on
 *     its own, which is enough for groups of collectives every rank issues in the same order
 *     (comm_nccl.c's ncclReduce / ncclBroadcast per part, rooted at each part's owner).
 *   - ncclSend / ncclRecv (exported; comm_nccl.c does not use them): through the sender's slot,
 *     a chunk at a time, the k-th send from r to q meeting the k-th receive of q from r; same
 *     sizes (else reported), device buffers, a peer of the communicator (itself included). A
 *     send completes when its receiver has taken the last chunk. Outside a group each runs on
 *     its own and waits for its peer (NCCL's deadlocks included); a group's sends and receives
 *     of one communicator are queued at the outermost ncclGroupEnd, after the group's
 *     collectives, as one piece of stream work that advances all of them in turn, so a group
 *     in which every rank posts its sends and receives in any order (a ring's shift, an
 *     all-to-all, a send to itself) completes.
 * For tests (not NCCL's API): mock_nccl_queued_now() counts the collectives queued on their
 * streams and not yet run, mock_nccl_max_queued() the most of one communicator at once since its
 * last call (more than 1: the caller issued the next before the one before had completed, so
 * before it could have seen it done); MOCK_NCCL_LOG=FILE appends a line "CALL DATATYPE COUNT
 * QUEUED" for every collective issued, QUEUED counting it and the ones of its communicator
 * still queued before it (e.g. "ncclAllReduce ncclBfloat16 10272 2").
 * Every problem is printed as "MOCK ERROR: ..." (mock_report) and makes the process exit 1.
 *
 * Not modelled: ranks on several hosts or several ranks in one process (each process is one
 * GPU); real NCCL timing (a collective costs host copies and barriers here, not a kernel and
 * a network); NCCL's own timeouts and a peer that hangs (a collective waits for it for ever,
 * as NCCL's does); non-blocking communicators (ncclInProgress), ncclCommSplit, user buffer
 * registration, ncclMemAlloc; groups that reorder collectives (a group of collectives that
 * the ranks issue in different orders deadlocks here, where NCCL may run it). */
#define _GNU_SOURCE
#include <cuda_runtime.h>
#include <errno.h>
#include <fcntl.h>
#include <nccl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/bf16.h"
#include "mock_api.h"

#define CHUNK ((size_t)16 << 20) /* one rank: a running collective looks for an abort between chunks */
#define SLOT ((size_t)2 << 20)   /* several: each rank's share of the region, the piece of one step */
#define MAX_RANKS 256
#define ID_MAGIC "dtrain-mock-nccl-id"
#define REGION_MAGIC "dtrain-mock-nccl-region-1"
#define INIT_TIMEOUT_S 120.0 /* ncclCommInitRank waits this long for every rank (MOCK_NCCL_INIT_TIMEOUT_S) */
#define PEER_CHECK_S 0.25    /* a waiting collective looks this often whether the rank it waits for lives */
#define NAP_NS 25000L        /* between two looks at the region */

/* ---------------------------------------------------------------- the shared region
 * Made by the first rank to join, sized for nranks: a header, one `peer` per rank, then
 * nranks slots of SLOT bytes (rank r's at slots + r * SLOT), page aligned. A collective's step
 * uses the whole of each rank's slot; a send from r to q the part q of r's slot (p2p_part). */

/* what a rank's collective is, so that every rank can check that all run the same one */
struct desc {
    int32_t call;   /* enum call */
    int32_t type;   /* ncclDataType_t */
    int32_t op;     /* ncclRedOp_t, -1: none */
    int32_t root;   /* -1: none */
    uint64_t count;
    uint64_t seq;   /* the collective's number in its communicator */
};

struct peer {
    int32_t joined;    /* 1 once this rank has joined */
    int32_t pid;       /* its process, watched while a collective waits for it */
    int32_t dev;       /* its CUDA device: two ranks on one device is NCCL's "duplicate GPU" */
    int32_t pad;
    uint64_t arrived;  /* barriers this rank has reached (the polling barrier) */
    struct desc desc;  /* the collective it runs now (valid between a step's two barriers) */
    /* point to point, per other rank q: the chunks this rank has posted to q (in its slot's
     * part for q: one at a time), the size of the message the posted chunk belongs to, and the
     * chunks this rank has taken from q; matched in issue order by these counts */
    uint64_t p2p_posted[MAX_RANKS];
    uint64_t p2p_bytes[MAX_RANKS];
    uint64_t p2p_taken[MAX_RANKS];
};

struct region {
    char magic[32];    /* REGION_MAGIC */
    int32_t ready;     /* set last by the creator: the fields below are valid */
    int32_t nranks;
    uint64_t bytes;    /* the whole region */
    uint64_t slots;    /* offset of the first slot */
    int32_t joined;    /* ranks that have joined so far */
    int32_t pad;
    struct peer peer[];
};

static size_t slots_offset(int nranks) {
    const size_t head = sizeof(struct region) + (size_t)nranks * sizeof(struct peer);
    return (head + 4095) & ~(size_t)4095;
}
static size_t region_bytes(int nranks) { return slots_offset(nranks) + (size_t)nranks * SLOT; }

/* ---------------------------------------------------------------- communicators */

enum call { C_ALLREDUCE, C_BROADCAST, C_ALLGATHER, C_REDUCESCATTER, C_REDUCE, C_SEND, C_RECV };
static const char *const call_names[] = {"ncclAllReduce", "ncclBroadcast", "ncclAllGather", "ncclReduceScatter",
                                         "ncclReduce", "ncclSend", "ncclRecv"};

struct ncclComm {
    int nranks, rank, dev;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int aborted;            /* queued work does nothing, running work stops */
    int freed;              /* destroyed or aborted: any later use is an error */
    int running;            /* collectives running right now (0 or 1: one stream each; more is reported) */
    unsigned long pending;  /* queued and not yet run */
    unsigned long max_pending; /* the most at any time since mock_nccl_max_queued last read it */
    unsigned long seq;      /* collectives issued, for messages */
    ncclResult_t async;     /* ncclRemoteError once a peer died (ncclCommGetAsyncError) */
    /* several ranks: the region (NULL with one rank, and once destroyed or aborted) */
    struct region *reg;
    size_t reg_bytes;
    uint64_t bars;          /* barriers this rank has reached: only the running collective touches it */
    /* the chunks of the sends to (receives from) each rank issued so far: where the next one's
     * chunks start in the region's counts */
    uint64_t p2p_sends[MAX_RANKS], p2p_recvs[MAX_RANKS];
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

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void nap(void) {
    const struct timespec t = {0, NAP_NS};
    nanosleep(&t, NULL);
}

/* ---------------------------------------------------------------- setup */

ncclResult_t ncclGetVersion(int *version) {
    if (!version) return MISUSE(ncclInvalidArgument, "ncclGetVersion: NULL version");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

/* "dtrain-mock-nccl-id /dtrain-mock-nccl.PID.K.RANDOM": the name of a region nobody has made
 * yet (the first rank to join makes it: an id that is never used leaves nothing behind) */
ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
    if (!id) return MISUSE(ncclInvalidArgument, "ncclGetUniqueId: NULL id");
    memset(id, 0, sizeof *id);
    pthread_mutex_lock(&comms_mu);
    unsigned long k = ++ids_made;
    pthread_mutex_unlock(&comms_mu);
    uint64_t rnd = 0;
    if (getrandom(&rnd, sizeof rnd, GRND_NONBLOCK) != (ssize_t)sizeof rnd) /* the clock is random enough */
        rnd ^= (uint64_t)(now_s() * 1e9) ^ (uint64_t)(uintptr_t)&rnd;
    snprintf(id->internal, sizeof id->internal, "%s /dtrain-mock-nccl.%ld.%lu.%016llx", ID_MAGIC, (long)getpid(), k,
             (unsigned long long)rnd);
    return ncclSuccess;
}

/* the region's name in an id ncclGetUniqueId made, else NULL */
static const char *id_region(const ncclUniqueId *id, char name[static NCCL_UNIQUE_ID_BYTES]) {
    const size_t m = strlen(ID_MAGIC " /");
    if (!memchr(id->internal, '\0', sizeof id->internal) || strncmp(id->internal, ID_MAGIC " /", m) != 0)
        return NULL;
    snprintf(name, NCCL_UNIQUE_ID_BYTES, "%s", id->internal + m - 1);
    for (const char *p = name + 1; *p; p++)
        if (!(*p == '.' || *p == '-' || (*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
              (*p >= 'A' && *p <= 'Z')))
            return NULL;
    return name;
}

static double init_timeout_s(void) {
    const char *v = getenv("MOCK_NCCL_INIT_TIMEOUT_S");
    if (!v || !v[0]) return INIT_TIMEOUT_S;
    char *end;
    const double t = strtod(v, &end);
    if (end != v && !*end && t > 0) return t;
    mock_report("NCCL: MOCK_NCCL_INIT_TIMEOUT_S=\"%s\": expected seconds > 0", v);
    return INIT_TIMEOUT_S;
}

/* The region `name` for nranks, mapped: created here when this rank is the first (O_EXCL; the
 * name is not unlinked until every rank has joined), else opened and awaited until its creator
 * has sized and initialised it. NULL on failure (reported). */
static struct region *map_region(const char *name, int nranks, int rank, double deadline, size_t *bytes) {
    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
    if (fd >= 0) { /* the first: size and initialise it, `ready` last */
        const size_t n = region_bytes(nranks);
        struct region *g = MAP_FAILED;
        if (ftruncate(fd, (off_t)n) == 0) g = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        const int err = errno;
        close(fd);
        if (g == MAP_FAILED) {
            shm_unlink(name);
            mock_report("NCCL: ncclCommInitRank: rank %d: cannot make the %zu-byte region %s: %s", rank, n, name,
                        strerror(err));
            return NULL;
        }
        memcpy(g->magic, REGION_MAGIC, sizeof REGION_MAGIC);
        g->nranks = nranks;
        g->bytes = n;
        g->slots = slots_offset(nranks);
        __atomic_store_n(&g->ready, 1, __ATOMIC_RELEASE);
        *bytes = n;
        return g;
    }
    if (errno != EEXIST || (fd = shm_open(name, O_RDWR, 0)) < 0) {
        const int err = errno; /* ENOENT: unlinked between the two opens, once every rank had joined */
        mock_report("NCCL: ncclCommInitRank: rank %d: cannot open the region %s: %s%s", rank, name, strerror(err),
                    err == ENOENT ? " (every rank had joined it already, and it was unlinked: did a rank join twice, "
                                    "or more than nranks processes?)" : "");
        return NULL;
    }
    /* another rank made it: wait for its size (ftruncate) */
    struct stat st;
    while (fstat(fd, &st) == 0 && (size_t)st.st_size < sizeof(struct region) && now_s() < deadline) nap();
    struct region *g = (size_t)st.st_size >= sizeof(struct region)
        ? mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (g == MAP_FAILED) {
        mock_report("NCCL: ncclCommInitRank: rank %d: the region %s was never sized by the rank that made it", rank,
                    name);
        return NULL;
    }
    while (!__atomic_load_n(&g->ready, __ATOMIC_ACQUIRE) && now_s() < deadline) nap();
    const char *bad = !g->ready ? "was never initialised by the rank that made it"
                      : memcmp(g->magic, REGION_MAGIC, sizeof REGION_MAGIC) != 0 || g->bytes != (uint64_t)st.st_size
                      ? "is not a region of this mock" : NULL;
    if (!bad && g->nranks != nranks) {
        mock_report("NCCL: ncclCommInitRank: rank %d says nranks %d, the rank that made the region said %d: every "
                    "rank must pass the same nranks", rank, nranks, g->nranks);
        munmap(g, (size_t)st.st_size);
        return NULL;
    }
    if (bad) {
        mock_report("NCCL: ncclCommInitRank: rank %d: the region %s %s", rank, name, bad);
        munmap(g, (size_t)st.st_size);
        return NULL;
    }
    *bytes = (size_t)st.st_size;
    return g;
}

/* Joins region g as `rank` and waits until all nranks have joined; ncclSuccess, or an error
 * (reported). */
static ncclResult_t join_region(struct region *g, int nranks, int rank, int dev, double deadline, double limit_s) {
    struct peer *me = &g->peer[rank];
    int was = 0;
    if (!__atomic_compare_exchange_n(&me->joined, &was, 1, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
        return MISUSE(ncclInvalidUsage, "ncclCommInitRank: rank %d of %d joined twice (two processes passed the same "
                      "rank, or one called ncclCommInitRank twice with one id)", rank, nranks);
    me->pid = (int32_t)getpid();
    me->dev = dev;
    __atomic_add_fetch(&g->joined, 1, __ATOMIC_SEQ_CST); /* publishes pid and dev */
    while (__atomic_load_n(&g->joined, __ATOMIC_SEQ_CST) < nranks && now_s() < deadline) nap();
    if (__atomic_load_n(&g->joined, __ATOMIC_SEQ_CST) < nranks) {
        char missing[256] = "";
        size_t k = 0;
        for (int q = 0; q < nranks && k < sizeof missing; q++)
            if (!__atomic_load_n(&g->peer[q].joined, __ATOMIC_SEQ_CST))
                k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%d", k ? ", " : "", q);
        mock_report("NCCL: ncclCommInitRank: rank %d waited %.0f s for all %d ranks to join; rank(s) %s never came",
                    rank, limit_s, nranks, missing);
        return fail(ncclSystemError, "ncclCommInitRank: rank(s) %s of %d never joined in %.0f s", missing, nranks,
                    limit_s);
    }
    for (int q = 0; q < nranks; q++)
        if (q != rank && g->peer[q].dev == dev)
            return MISUSE(ncclInvalidUsage, "ncclCommInitRank: Duplicate GPU detected: rank %d and rank %d both on "
                          "CUDA device %d (one process per GPU: cudaSetDevice before ncclCommInitRank)", rank, q, dev);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank) {
    if (!comm) return MISUSE(ncclInvalidArgument, "ncclCommInitRank: NULL comm");
    *comm = NULL;
    char buf[NCCL_UNIQUE_ID_BYTES];
    const char *name = id_region(&id, buf);
    if (!name)
        return MISUSE(ncclInvalidArgument, "ncclCommInitRank: the unique id was not made by ncclGetUniqueId "
                      "(not passed on from rank 0?)");
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return MISUSE(ncclInvalidArgument, "ncclCommInitRank: nranks %d, rank %d: expected 1 <= nranks <= %d (the "
                      "mock's limit) and 0 <= rank < nranks", nranks, rank, MAX_RANKS);
    int dev = -1, count = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaGetDeviceCount(&count) != cudaSuccess || dev < 0 || dev >= count)
        return MISUSE(ncclInvalidUsage, "ncclCommInitRank: no usable current CUDA device (%d of %d)", dev, count);
    struct region *g = NULL;
    size_t bytes = 0;
    if (nranks > 1) {
        const double limit = init_timeout_s(), deadline = now_s() + limit;
        if (!(g = map_region(name, nranks, rank, deadline, &bytes)))
            return fail(ncclSystemError, "ncclCommInitRank: rank %d cannot use the region %s", rank, name);
        const ncclResult_t r = join_region(g, nranks, rank, dev, deadline, limit);
        shm_unlink(name); /* every rank has it mapped (or this one gives up): the name can go */
        if (r != ncclSuccess) {
            munmap(g, bytes);
            return r;
        }
    }
    struct ncclComm *c = calloc(1, sizeof *c);
    if (!c) {
        if (g) munmap(g, bytes);
        return fail(ncclSystemError, "ncclCommInitRank: out of memory");
    }
    c->nranks = nranks;
    c->rank = rank;
    c->dev = dev;
    c->reg = g;
    c->reg_bytes = bytes;
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_mutex_lock(&comms_mu);
    c->next = comms;
    comms = c;
    pthread_mutex_unlock(&comms_mu);
    *comm = c;
    return ncclSuccess;
}

/* under c->mu, once nothing of c runs or ever will: the region goes (the struct stays, to find use after free) */
static void release(struct ncclComm *c) {
    if (c->reg) munmap(c->reg, c->reg_bytes);
    c->reg = NULL;
    __atomic_store_n(&c->freed, 1, __ATOMIC_SEQ_CST);
}

/* NCCL accepts NULL for both (nothing to do) */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    struct ncclComm *c = live(comm, "ncclCommDestroy");
    if (!c) return ncclInvalidArgument;
    pthread_mutex_lock(&c->mu);
    while (c->pending) pthread_cond_wait(&c->cv, &c->mu); /* finalize: the queued work completes */
    release(c);
    pthread_mutex_unlock(&c->mu);
    return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
    if (!comm) return ncclSuccess;
    struct ncclComm *c = live(comm, "ncclCommAbort");
    if (!c) return ncclInvalidArgument;
    pthread_mutex_lock(&c->mu);
    __atomic_store_n(&c->aborted, 1, __ATOMIC_SEQ_CST);
    while (c->running) pthread_cond_wait(&c->cv, &c->mu); /* the running one stops at its next chunk or wait */
    release(c); /* queued work looks at `aborted` only: it never touches the region */
    pthread_mutex_unlock(&c->mu);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError) {
    struct ncclComm *c = live(comm, "ncclCommGetAsyncError");
    if (!c) return ncclInvalidArgument;
    if (!asyncError) return MISUSE(ncclInvalidArgument, "ncclCommGetAsyncError: NULL result");
    *asyncError = __atomic_load_n(&c->async, __ATOMIC_SEQ_CST); /* ncclRemoteError once a peer died */
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

/* ---------------------------------------------------------------- datatypes and reductions */

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

static const char *op_name(int op) {
    switch (op) {
    case ncclSum: return "sum";
    case ncclProd: return "prod";
    case ncclMax: return "max";
    case ncclMin: return "min";
    case ncclAvg: return "avg";
    default: return "none";
    }
}

static int known_op(ncclRedOp_t op) {
    return op == ncclSum || op == ncclProd || op == ncclMax || op == ncclMin || op == ncclAvg;
}

static float bits_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* bf16: dtrain/bf16.h's (round to nearest even, as CUDA's __float2bfloat16_rn; NaN quieted) */

static float half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) return bits_float(sign | 0x7f800000u | m << 13);
    if (e) return bits_float(sign | (e + 112) << 23 | m << 13);
    const float sub = (float)m * 0x1p-24f; /* zero or subnormal: exact */
    return bits_float(sign | float_bits(sub));
}
/* round to nearest even, with subnormals, overflow to infinity; NaN stays NaN (quieted) */
static uint16_t float_to_half(float f) {
    const uint32_t u = float_bits(f), sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a >= 0x47800000u) return (uint16_t)(sign | 0x7c00); /* 65536 and more (and infinity) */
    if (a < 0x38800000u) { /* under 2^-14: a multiple of 2^-24 (subnormal), or 0 */
        if (a < 0x33000000u) return (uint16_t)sign; /* at most 2^-25: rounds to 0 */
        const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e; /* 14..24 */
        uint32_t q = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
        q += rem > halfway || (rem == halfway && (q & 1));
        return (uint16_t)(sign | q);
    }
    uint32_t h = (a >> 13) - (112u << 10); /* rebias the exponent; the carry of rounding may reach infinity */
    const uint32_t rem = a & 0x1fff;
    h += rem > 0x1000 || (rem == 0x1000 && (h & 1));
    return (uint16_t)(sign | h);
}

/* one step of a reduction over m elements: d = x (first) or d = d OP x; avg over floating types
 * is a sum of the inputs each multiplied by `scale` (1/n in the type, as NCCL's PreMulSum). */
#define FLOAT_STEP(T)                                                                           \
    do {                                                                                        \
        T *d = dv;                                                                              \
        const T *x = xv, s = (T)scale;                                                          \
        for (size_t i = 0; i < m; i++) {                                                        \
            const T b = op == ncclAvg ? x[i] * s : x[i];                                        \
            d[i] = first ? b : op == ncclProd ? d[i] * b : op == ncclMax ? (b > d[i] ? b : d[i]) \
                 : op == ncclMin ? (b < d[i] ? b : d[i]) : d[i] + b;                            \
        }                                                                                       \
    } while (0)
/* integers: sum and product wrap (in U, unsigned); avg sums here, divided at the end */
#define INT_STEP(T, U)                                                                          \
    do {                                                                                        \
        T *d = dv;                                                                              \
        const T *x = xv;                                                                        \
        for (size_t i = 0; i < m; i++) {                                                        \
            const T b = x[i];                                                                   \
            d[i] = first ? b : op == ncclProd ? (T)((U)d[i] * (U)b)                             \
                 : op == ncclMax ? (b > d[i] ? b : d[i]) : op == ncclMin ? (b < d[i] ? b : d[i]) \
                 : (T)((U)d[i] + (U)b);                                                         \
        }                                                                                       \
    } while (0)
#define INT_DIV(T)                                                                              \
    do {                                                                                        \
        T *d = dv;                                                                              \
        for (size_t i = 0; i < m; i++) d[i] = (T)(d[i] / (T)n);                                 \
    } while (0)

/* halves and bf16: through float, every result rounded back (max and min keep an input's bits) */
static void step16(uint16_t *d, const uint16_t *x, size_t m, ncclRedOp_t op, int first, int bf) {
    float (*get)(uint16_t) = bf ? dt_bf16_to_float : half_to_float;
    uint16_t (*put)(float) = bf ? dt_float_to_bf16 : float_to_half;
    for (size_t i = 0; i < m; i++) {
        if (first) {
            d[i] = x[i];
            continue;
        }
        const float a = get(d[i]), b = get(x[i]);
        d[i] = op == ncclProd ? put(a * b) : op == ncclMax ? (b > a ? x[i] : d[i])
             : op == ncclMin ? (b < a ? x[i] : d[i]) : put(a + b);
    }
}

/* d = x * scale for halves and bf16 (avg: each input scaled before it is summed) */
static void scale16(uint16_t *d, size_t m, float scale, int bf) {
    for (size_t i = 0; i < m; i++)
        d[i] = bf ? dt_float_to_bf16(dt_bf16_to_float(d[i]) * scale) : float_to_half(half_to_float(d[i]) * scale);
}

static void step(void *dv, const void *xv, size_t m, ncclDataType_t t, ncclRedOp_t op, int first, double scale) {
    switch (t) {
    case ncclInt8: INT_STEP(int8_t, uint8_t); break;
    case ncclUint8: INT_STEP(uint8_t, unsigned); break;
    case ncclInt32: INT_STEP(int32_t, uint32_t); break;
    case ncclUint32: INT_STEP(uint32_t, uint32_t); break;
    case ncclInt64: INT_STEP(int64_t, uint64_t); break;
    case ncclUint64: INT_STEP(uint64_t, uint64_t); break;
    case ncclFloat32: FLOAT_STEP(float); break;
    case ncclFloat64: FLOAT_STEP(double); break;
    default: step16(dv, xv, m, op, first, t == ncclBfloat16); break;
    }
}

/* out(m) = the reduction of in[0](m), ..., in[n-1](m), in that order; `tmp` (m elements)
 * holds a scaled input of avg over halves or bf16 */
static void reduce(void *out, const char *const *in, int n, size_t m, ncclDataType_t t, ncclRedOp_t op, void *tmp) {
    const int is16 = t == ncclFloat16 || t == ncclBfloat16, bf = t == ncclBfloat16;
    /* NCCL: float(1.0 / nranks) in the type; halves and bf16 round it once more */
    const float inv = (float)(1.0 / n);
    const float s16 = bf ? dt_bf16_to_float(dt_float_to_bf16(inv)) : half_to_float(float_to_half(inv));
    const double scale = t == ncclFloat64 ? 1.0 / n : (double)(float)(1.0 / n);
    for (int q = 0; q < n; q++) {
        const void *x = in[q];
        if (is16 && op == ncclAvg) { /* the scaled input, then summed */
            memcpy(tmp, x, m * 2);
            scale16(tmp, m, s16, bf);
            x = tmp;
        }
        step(out, x, m, t, is16 && op == ncclAvg ? ncclSum : op, q == 0, scale);
    }
    if (op != ncclAvg) return;
    void *dv = out;
    switch (t) {
    case ncclInt8: INT_DIV(int8_t); break;
    case ncclUint8: INT_DIV(uint8_t); break;
    case ncclInt32: INT_DIV(int32_t); break;
    case ncclUint32: INT_DIV(uint32_t); break;
    case ncclInt64: INT_DIV(int64_t); break;
    case ncclUint64: INT_DIV(uint64_t); break;
    default: break; /* floating types: scaled before the sum */
    }
}

/* ---------------------------------------------------------------- bookkeeping of collectives */

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

/* One queued collective (or, for a group's point-to-point calls, several: `next`). */
typedef struct job {
    struct ncclComm *c;
    enum call call;
    const char *send; /* the whole input */
    char *recv;       /* the whole output */
    size_t count;     /* elements: all-reduce, broadcast, reduce: the buffer; all-gather: per rank
                         (sendcount); reduce-scatter: per part (recvcount); send, recv: the message */
    ncclDataType_t type;
    int op;           /* ncclRedOp_t, or -1 */
    int root;         /* broadcast, reduce: the root; send, recv: the peer; else -1 */
    unsigned long seq;
    /* send, recv: its chunks are base .. base + chunks - 1 of the pair's; done: k of them */
    uint64_t base, chunks, k;
    int finished;
    cudaStream_t stream; /* a grouped send or recv: where ncclGroupEnd queues it */
    struct job *next;    /* a group's further sends and receives of the communicator, run together */
} job;

/* ---------------------------------------------------------------- several ranks: the exchange */

static char *slot(struct ncclComm *c, int q) { return (char *)c->reg + c->reg->slots + (size_t)q * SLOT; }

/* pid has exited: gone (ESRCH), or a zombie its parent has not reaped yet */
static int peer_gone(pid_t pid) {
    if (kill(pid, 0) != 0) return errno == ESRCH;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    const size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')'); /* "pid (comm) S ...": the name may hold anything */
    return p && (p[2] == 'Z' || p[2] == 'X');
}

/* a peer died while this rank waited for it in collective j: the communicator is broken */
static void peer_died(struct ncclComm *c, const job *j, int q) {
    /* the message first: a caller that sees the error asks ncclGetLastError for it at once */
    fail(ncclRemoteError, "%s #%lu: rank %d (process %ld) of the communicator's %d exited while rank %d waited for "
         "it", call_names[j->call], j->seq, q, (long)c->reg->peer[q].pid, c->nranks, c->rank);
    __atomic_store_n(&c->async, ncclRemoteError, __ATOMIC_SEQ_CST);
}

/* Waits until every rank has reached this rank's next barrier. Polled
 * in shared memory, so that an abort can leave it (pthread_barrier_wait could not): each rank
 * counts the barriers it has reached in its own `arrived`, and barrier k is passed once the
 * counts of all ranks are k or more. Nothing is ever reset: a rank that stops (abort,
 * death) leaves nothing to undo, and a waiting rank knows which rank it waits for, whose
 * process it watches. A dead peer sets the asynchronous error, but the wait goes on, as an
 * NCCL kernel's does: its stream must not get past a collective that never completed (the
 * caller would take garbage for a result), so only the abort the caller makes after seeing the
 * error ends it. 0: passed; 1: aborted. */
static int barrier(struct ncclComm *c, const job *j) {
    struct region *g = c->reg;
    const uint64_t k = ++c->bars;
    __atomic_store_n(&g->peer[c->rank].arrived, k, __ATOMIC_RELEASE);
    double watch = 0;
    for (int q = 0; q < c->nranks;) {
        if (__atomic_load_n(&g->peer[q].arrived, __ATOMIC_ACQUIRE) >= k) {
            q++;
            continue;
        }
        if (__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) return 1;
        const double t = now_s();
        if (watch == 0) {
            watch = t + PEER_CHECK_S;
        } else if (t >= watch && !__atomic_load_n(&c->async, __ATOMIC_SEQ_CST)) {
            if (peer_gone((pid_t)g->peer[q].pid)) peer_died(c, j, q);
            watch = t + PEER_CHECK_S;
        }
        nap();
    }
    return 0;
}

static void describe(char *s, size_t n, const struct desc *d) {
    char root[32] = "";
    if (d->root >= 0) snprintf(root, sizeof root, ", root %d", d->root);
    snprintf(s, n, "%s(%s, count %llu%s%s%s)", d->call >= 0 && d->call <= C_RECV ? call_names[d->call] : "?",
             type_name((ncclDataType_t)d->type), (unsigned long long)d->count, d->op >= 0 ? ", " : "",
             d->op >= 0 ? op_name(d->op) : "", root);
}

/* After the first barrier of collective j: every rank runs the same one (else reported: 1) */
static int check_same(struct ncclComm *c, const job *j) {
    const struct desc *mine = &c->reg->peer[c->rank].desc;
    for (int q = 0; q < c->nranks; q++) {
        const struct desc *d = &c->reg->peer[q].desc;
        if (d->call == mine->call && d->type == mine->type && d->op == mine->op && d->root == mine->root &&
            d->count == mine->count)
            continue;
        char a[160], b[160];
        describe(a, sizeof a, mine);
        describe(b, sizeof b, d);
        mock_report("NCCL: collective #%lu of the communicator: rank %d runs %s, rank %d runs %s (its #%llu): every "
                    "rank must issue the same collectives, with the same datatype, count, op and root, in the same "
                    "order", j->seq, c->rank, a, q, b, (unsigned long long)d->seq);
        return 1;
    }
    return 0;
}

/* elements of one step: a slot's worth, or for reduce-scatter a slot holds a piece of every part */
static size_t step_elems(const struct ncclComm *c, const job *j) {
    const size_t e = SLOT / type_size(j->type);
    return j->call == C_REDUCESCATTER ? e / (size_t)c->nranks : e;
}

/* this rank's input for the step [off, off + m) into its slot */
static void put_step(struct ncclComm *c, const job *j, size_t off, size_t m) {
    const size_t ts = type_size(j->type), b = m * ts;
    char *mine = slot(c, c->rank);
    switch (j->call) {
    case C_BROADCAST:
        if (c->rank == j->root) memcpy(mine, j->send + off * ts, b);
        break;
    case C_REDUCESCATTER: /* the step's piece of every part, one after another */
        for (int q = 0; q < c->nranks; q++)
            memcpy(mine + (size_t)q * b, j->send + ((size_t)q * j->count + off) * ts, b);
        break;
    default: memcpy(mine, j->send + off * ts, b); break;
    }
}

/* this rank's output for the step [off, off + m) from all slots */
static void get_step(struct ncclComm *c, const job *j, size_t off, size_t m, void *tmp) {
    const size_t ts = type_size(j->type), b = m * ts;
    const char *in[MAX_RANKS];
    switch (j->call) {
    case C_ALLREDUCE:
    case C_REDUCE:
        if (j->call == C_REDUCE && c->rank != j->root) break; /* the root's only */
        for (int q = 0; q < c->nranks; q++) in[q] = slot(c, q);
        reduce(j->recv + off * ts, in, c->nranks, m, j->type, (ncclRedOp_t)j->op, tmp);
        break;
    case C_REDUCESCATTER:
        for (int q = 0; q < c->nranks; q++) in[q] = slot(c, q) + (size_t)c->rank * b;
        reduce(j->recv + off * ts, in, c->nranks, m, j->type, (ncclRedOp_t)j->op, tmp);
        break;
    case C_BROADCAST: memcpy(j->recv + off * ts, slot(c, j->root), b); break;
    case C_ALLGATHER:
        for (int q = 0; q < c->nranks; q++) memcpy(j->recv + ((size_t)q * j->count + off) * ts, slot(c, q), b);
        break;
    default: break;
    }
}

/* collective j over the region, step by step (on its stream's thread) */
static void exchange(struct ncclComm *c, const job *j) {
    struct peer *me = &c->reg->peer[c->rank];
    me->desc = (struct desc){j->call, j->type, j->op, j->root, j->count, j->seq}; /* read after the first barrier */
    const size_t e = step_elems(c, j);
    void *tmp = NULL; /* avg over halves or bf16: the scaled input */
    if ((j->type == ncclFloat16 || j->type == ncclBfloat16) && j->op == ncclAvg && !(tmp = malloc(e * 2))) {
        mock_report("NCCL: %s #%lu: out of host memory", call_names[j->call], j->seq);
        return;
    }
    for (size_t off = 0; off < j->count; off += e) {
        const size_t m = j->count - off < e ? j->count - off : e;
        put_step(c, j, off, m);
        if (barrier(c, j)) break;
        /* a mismatch stops every rank here, after the second barrier: they all read the descs first */
        const int bad = off == 0 && check_same(c, j);
        if (!bad) get_step(c, j, off, m, tmp);
        if (barrier(c, j) || bad) break;
    }
    free(tmp);
}

/* ---------------------------------------------------------------- point to point
 * ncclSend / ncclRecv between ranks r and q go through r's slot: its part for q (SLOT / nranks
 * bytes) holds one chunk of r's message to q at a time. r posts a chunk when q has taken every
 * chunk posted before (p2p_posted[q] == q's p2p_taken[r]), q takes it and counts it; r's send
 * completes once q has taken its last chunk (so the slot is free again when the next collective
 * runs). Both sides count chunks per pair from the start, so the k-th send from r to q meets
 * the k-th receive of q from r, whatever else runs. The calls of a group run together at
 * ncclGroupEnd, each going as far as it can in turn, so a group whose sends and receives every
 * peer issues in some order completes (a ring's shift, an all-to-all); one outside a group runs
 * alone and waits for its peer. */

static size_t p2p_part(const struct ncclComm *c) { return (SLOT / (size_t)c->nranks) & ~(size_t)63; }

/* one step of send or receive j, as far as it can go without waiting; 1 once it is complete */
static int p2p_step(struct ncclComm *c, job *j, int *moved) {
    struct region *g = c->reg;
    const int me = c->rank, q = j->root;
    const size_t part = p2p_part(c), bytes = j->count * type_size(j->type);
    if (j->call == C_SEND) {
        uint64_t *posted = &g->peer[me].p2p_posted[q];
        const uint64_t k = j->base + j->k;
        if (j->k < j->chunks && *posted == k && __atomic_load_n(&g->peer[q].p2p_taken[me], __ATOMIC_ACQUIRE) == k) {
            const size_t off = j->k * part, m = bytes - off < part ? bytes - off : part;
            memcpy(slot(c, me) + (size_t)q * part, j->send + off, m);
            g->peer[me].p2p_bytes[q] = bytes;
            __atomic_store_n(posted, k + 1, __ATOMIC_RELEASE);
            j->k++;
            *moved = 1;
        }
        return j->k == j->chunks &&
               __atomic_load_n(&g->peer[q].p2p_taken[me], __ATOMIC_ACQUIRE) >= j->base + j->chunks;
    }
    uint64_t *taken = &g->peer[me].p2p_taken[q];
    const uint64_t k = j->base + j->k;
    if (j->k < j->chunks && *taken == k && __atomic_load_n(&g->peer[q].p2p_posted[me], __ATOMIC_ACQUIRE) > k) {
        if (g->peer[q].p2p_bytes[me] != bytes) {
            mock_report("NCCL: ncclRecv #%lu on rank %d: %zu bytes expected from rank %d, which sends %llu: a send and "
                        "its receive must have the same size", j->seq, me, bytes, q,
                        (unsigned long long)g->peer[q].p2p_bytes[me]);
            j->k = j->chunks; /* given up (the sender waits for ever: abort) */
            return 1;
        }
        const size_t off = j->k * part, m = bytes - off < part ? bytes - off : part;
        memcpy(j->recv + off, slot(c, q) + (size_t)me * part, m);
        __atomic_store_n(taken, k + 1, __ATOMIC_RELEASE);
        j->k++;
        *moved = 1;
    }
    return j->k == j->chunks;
}

/* the sends and receives of chain j (a group's, or one), on their stream's thread, until all
 * are complete or the communicator is aborted; a dead peer sets the asynchronous error */
static void p2p_run(struct ncclComm *c, job *list) {
    double watch = 0;
    for (;;) {
        int all = 1, moved = 0;
        for (job *j = list; j; j = j->next)
            if (!j->finished) all &= j->finished = p2p_step(c, j, &moved);
        if (all || __atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) return;
        const double t = now_s();
        if (moved || watch == 0) {
            watch = t + PEER_CHECK_S;
        } else if (t >= watch && !__atomic_load_n(&c->async, __ATOMIC_SEQ_CST)) {
            for (job *j = list; j; j = j->next)
                if (!j->finished && peer_gone((pid_t)c->reg->peer[j->root].pid)) {
                    peer_died(c, j, j->root);
                    break;
                }
            watch = t + PEER_CHECK_S;
        }
        if (!moved) nap();
    }
}

/* one rank: its sends to itself meet its receives in the same group, in order */
static void p2p_self(struct ncclComm *c, job *list) {
    job *recv = list;
    for (job *send = list; send; send = send->next) {
        if (send->call != C_SEND) continue;
        while (recv && recv->call != C_RECV) recv = recv->next;
        const size_t bytes = send->count * type_size(send->type);
        if (!recv) {
            mock_report("NCCL: ncclSend #%lu of %zu bytes to itself has no ncclRecv in its group: it never completes",
                        send->seq, bytes);
            return;
        }
        if (recv->count * type_size(recv->type) != bytes) {
            mock_report("NCCL: ncclSend #%lu of %zu bytes to itself meets an ncclRecv of %zu bytes: a send and its "
                        "receive must have the same size", send->seq, bytes, recv->count * type_size(recv->type));
            return;
        }
        memmove(recv->recv, send->send, bytes);
        recv = recv->next;
    }
    for (; recv; recv = recv->next)
        if (recv->call == C_RECV)
            mock_report("NCCL: ncclRecv #%lu from itself has no ncclSend in its group: it never completes", recv->seq);
}

/* on the stream's thread, in stream order */
static void run_job(void *arg) {
    job *j = arg;
    struct ncclComm *c = j->c;
    pthread_mutex_lock(&c->mu);
    const int go = !c->aborted, twice = go && c->running;
    c->running += go;
    pthread_mutex_unlock(&c->mu);
    if (twice && c->nranks > 1)
        mock_report("NCCL: %s #%lu runs while another collective of the communicator (rank %d of %d) runs: "
                    "collectives of one communicator issued on two streams without ordering between them",
                    call_names[j->call], j->seq, c->rank, c->nranks);
    if (go && c->nranks == 1 && (j->call == C_SEND || j->call == C_RECV)) {
        p2p_self(c, j);
    } else if (go && c->nranks == 1) { /* a copy of the input to where the output's own part lies */
        const size_t ts = type_size(j->type), bytes = j->count * ts;
        char *dst = j->recv;
        if (j->call == C_ALLGATHER) dst += (size_t)c->rank * bytes;
        if (dst != j->send)
            for (size_t off = 0; off < bytes && !__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST); off += CHUNK)
                memmove(dst + off, j->send + off, bytes - off < CHUNK ? bytes - off : CHUNK);
    } else if (go) {
        if (j->call == C_SEND || j->call == C_RECV) p2p_run(c, j);
        else exchange(c, j);
    }
    pthread_mutex_lock(&c->mu);
    c->running -= go;
    c->pending--;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    while (j) {
        job *next = j->next;
        free(j);
        j = next;
    }
}

/* Queues job j (its own allocation; a chain of a group's sends and receives) on `stream` as
 * the communicator's next collective; `call` names it for the profiler's log. */
static ncclResult_t enqueue(struct ncclComm *c, job *j, const char *call, cudaStream_t stream) {
    pthread_mutex_lock(&c->mu);
    const unsigned long queued = ++c->pending, seq = ++c->seq;
    if (c->pending > c->max_pending) c->max_pending = c->pending;
    pthread_mutex_unlock(&c->mu);
    for (job *k = j; k; k = k->next) {
        k->seq = seq;
        log_call(call_names[k->call], k->type, k->count, queued);
    }
    mock_enqueue_fn(stream, call, run_job, j);
    return ncclSuccess;
}

/* The checks every collective shares, then t queued on the stream. send_count, recv_count: the
 * buffers' sizes in elements; in_place: the one sendbuff address that may overlap recvbuff
 * (in place). */
static ncclResult_t collective(const job *t, size_t send_count, size_t recv_count, uintptr_t in_place,
                               ncclComm_t comm, cudaStream_t stream) {
    const char *call = call_names[t->call];
    struct ncclComm *c = live(comm, call);
    if (!c) return ncclInvalidArgument;
    const size_t ts = type_size(t->type);
    if (!ts) return MISUSE(ncclInvalidArgument, "%s: unknown datatype %d", call, (int)t->type);
    if (recv_count > SIZE_MAX / ts || send_count > SIZE_MAX / ts)
        return MISUSE(ncclInvalidArgument, "%s: count %zu too large", call, t->count);
    if (t->count == 0) {
        log_call(call, t->type, 0, 0);
        return ncclSuccess; /* NCCL: nothing to do, no pointer is looked at */
    }
    const size_t bytes = send_count * ts, recv_bytes = recv_count * ts;
    char what[128];
    snprintf(what, sizeof what, "%s sendbuff (%zu bytes)", call, bytes);
    if (mock_check_dev_range(t->send, bytes, what))
        return fail(ncclInvalidArgument, "%s: sendbuff is not device memory or too small", call);
    snprintf(what, sizeof what, "%s recvbuff (%zu bytes)", call, recv_bytes);
    if (mock_check_dev_range(t->recv, recv_bytes, what))
        return fail(ncclInvalidArgument, "%s: recvbuff is not device memory or too small", call);
    const char *s = t->send, *r = t->recv;
    if (s < r + recv_bytes && r < s + bytes && (uintptr_t)s != in_place)
        return MISUSE(ncclInvalidArgument, "%s: sendbuff %p and recvbuff %p overlap without being in place (NCCL's "
                      "result is undefined)", call, (const void *)s, (const void *)r);
    job *j = malloc(sizeof *j);
    if (!j) return fail(ncclSystemError, "%s: out of memory", call);
    *j = *t;
    j->c = c;
    j->next = NULL;
    return enqueue(c, j, call, stream);
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
    if (!known_op(op)) return MISUSE(ncclInvalidArgument, "ncclAllReduce: unknown reduction op %d", (int)op);
    const job t = {.call = C_ALLREDUCE, .send = sendbuff, .recv = recvbuff, .count = count, .type = datatype,
                   .op = op, .root = -1};
    return collective(&t, count, count, (uintptr_t)recvbuff, comm, stream);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,
                           ncclComm_t comm, cudaStream_t stream) {
    struct ncclComm *c = live(comm, "ncclBroadcast");
    if (!c) return ncclInvalidArgument;
    if (root < 0 || root >= c->nranks)
        return MISUSE(ncclInvalidArgument, "ncclBroadcast: root %d of %d rank(s)", root, c->nranks);
    const job t = {.call = C_BROADCAST, .send = sendbuff, .recv = recvbuff, .count = count, .type = datatype,
                   .op = -1, .root = root};
    return collective(&t, count, count, (uintptr_t)recvbuff, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
    struct ncclComm *c = live(comm, "ncclAllGather");
    if (!c) return ncclInvalidArgument;
    const size_t ts = type_size(datatype), n = (size_t)c->nranks;
    if (ts && sendcount > SIZE_MAX / ts / n)
        return MISUSE(ncclInvalidArgument, "ncclAllGather: count %zu too large", sendcount);
    const job t = {.call = C_ALLGATHER, .send = sendbuff, .recv = recvbuff, .count = sendcount, .type = datatype,
                   .op = -1, .root = -1};
    /* in place: sendbuff == recvbuff + rank * sendcount */
    return collective(&t, sendcount, sendcount * n, (uintptr_t)recvbuff + (uintptr_t)c->rank * sendcount * ts, comm,
                      stream);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
    if (!known_op(op)) return MISUSE(ncclInvalidArgument, "ncclReduceScatter: unknown reduction op %d", (int)op);
    struct ncclComm *c = live(comm, "ncclReduceScatter");
    if (!c) return ncclInvalidArgument;
    const size_t ts = type_size(datatype), n = (size_t)c->nranks;
    if (ts && recvcount > SIZE_MAX / ts / n)
        return MISUSE(ncclInvalidArgument, "ncclReduceScatter: count %zu too large", recvcount);
    const job t = {.call = C_REDUCESCATTER, .send = sendbuff, .recv = recvbuff, .count = recvcount, .type = datatype,
                   .op = op, .root = -1};
    /* in place: recvbuff == sendbuff + rank * recvcount, i.e. sendbuff == recvbuff - rank * recvcount */
    return collective(&t, recvcount * n, recvcount, (uintptr_t)recvbuff - (uintptr_t)c->rank * recvcount * ts, comm,
                      stream);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
    if (!known_op(op)) return MISUSE(ncclInvalidArgument, "ncclReduce: unknown reduction op %d", (int)op);
    struct ncclComm *c = live(comm, "ncclReduce");
    if (!c) return ncclInvalidArgument;
    if (root < 0 || root >= c->nranks)
        return MISUSE(ncclInvalidArgument, "ncclReduce: root %d of %d rank(s)", root, c->nranks);
    const job t = {.call = C_REDUCE, .send = sendbuff, .recv = recvbuff, .count = count, .type = datatype, .op = op,
                   .root = root};
    return collective(&t, count, count, (uintptr_t)recvbuff, comm, stream);
}

/* Groups: collectives run as they are issued (every rank issues them in the same order: each on
 * its own is enough); sends and receives wait in group_p2p until the outermost ncclGroupEnd,
 * which queues each communicator's as one job on the stream of its first. */
static __thread int group_depth;
static __thread job *group_p2p;

static ncclResult_t p2p(enum call call, void *buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                        cudaStream_t stream) {
    const char *name = call_names[call];
    struct ncclComm *c = live(comm, name);
    if (!c) return ncclInvalidArgument;
    const size_t ts = type_size(type);
    if (!ts) return MISUSE(ncclInvalidArgument, "%s: unknown datatype %d", name, (int)type);
    if (peer < 0 || peer >= c->nranks)
        return MISUSE(ncclInvalidArgument, "%s: peer %d of %d rank(s)", name, peer, c->nranks);
    if (count > SIZE_MAX / ts) return MISUSE(ncclInvalidArgument, "%s: count %zu too large", name, count);
    if (count == 0) {
        log_call(name, type, 0, 0);
        return ncclSuccess; /* nothing to send or receive */
    }
    char what[128];
    snprintf(what, sizeof what, "%s %s (%zu bytes)", name, call == C_SEND ? "sendbuff" : "recvbuff", count * ts);
    if (mock_check_dev_range(buf, count * ts, what))
        return fail(ncclInvalidArgument, "%s: the buffer is not device memory or too small", name);
    job *j = calloc(1, sizeof *j);
    if (!j) return fail(ncclSystemError, "%s: out of memory", name);
    *j = (job){.c = c, .call = call, .send = buf, .recv = buf, .count = count, .type = type, .op = -1, .root = peer,
               .stream = stream};
    if (c->nranks > 1) { /* its place among the pair's chunks, in issue order */
        const size_t part = p2p_part(c);
        uint64_t *issued = call == C_SEND ? &c->p2p_sends[peer] : &c->p2p_recvs[peer];
        j->chunks = (count * ts + part - 1) / part;
        j->base = *issued;
        *issued += j->chunks;
    }
    if (!group_depth) return enqueue(c, j, name, stream);
    job **tail = &group_p2p;
    while (*tail) tail = &(*tail)->next;
    *tail = j;
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return p2p(C_SEND, (void *)sendbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
    return p2p(C_RECV, recvbuff, count, datatype, peer, comm, stream);
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

/* the group's sends and receives, one job per communicator (in the order of their first call) */
static ncclResult_t group_flush(void) {
    ncclResult_t r = ncclSuccess;
    while (group_p2p) {
        struct ncclComm *c = group_p2p->c;
        job *chain = NULL, **tail = &chain, **rest = &group_p2p;
        while (*rest) {
            job *j = *rest;
            if (j->c != c) {
                rest = &j->next;
                continue;
            }
            *rest = j->next; /* moved from the group's list to c's chain */
            j->next = NULL;
            *tail = j;
            tail = &j->next;
            if (j->stream != chain->stream)
                mock_report("NCCL: a group's sends and receives of one communicator on two streams: the mock runs "
                            "them together on the stream of the first");
        }
        if (live(c, "ncclGroupEnd")) {
            enqueue(c, chain, "ncclGroupEnd", chain->stream);
            continue;
        }
        r = ncclInvalidArgument; /* destroyed inside the group */
        while (chain) {
            job *next = chain->next;
            free(chain);
            chain = next;
        }
    }
    return r;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0) return MISUSE(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    return --group_depth ? ncclSuccess : group_flush();
}
