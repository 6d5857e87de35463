/* test_nccl_ranks.c — the nccl collective backend (src/comm/comm_nccl.c) with 2, 3 and 4 ranks,
 * one process each, on the mock GPUs (MOCK_DEVICE_COUNT=4) and the mock NCCL of several ranks
 * (mock_nccl.c as libnccl.so.2, found by comm_nccl.c's dlopen on LD_LIBRARY_PATH):
 *
 *   LD_LIBRARY_PATH=$OUT MOCK_DEVICE_COUNT=4 $OUT/test_nccl_ranks
 *
 * The parent makes a shm world (dtrain's bootstrap communicator, as src/run/launch.c does) and
 * forks the ranks BEFORE any CUDA call (CUDA, and the mock, refuse a child forked after its
 * parent used CUDA); each rank takes GPU `rank`, joins the shm world and then NCCL
 * (dt_comm_init_nccl), and checks through dtrain's API, against exact expected values (small
 * integers, so that every float and bf16 sum is exact):
 *   - all-reduce sum and avg of device and host buffers larger than the mock's 2 MiB slot (in
 *     pieces), bf16 on the wire, several buckets in flight at once;
 *   - broadcast from the last rank (not 0) of device and host bytes, larger than a slot;
 *   - all-gather of device and host bytes into poisoned outputs;
 *   - reduce-scatter and all-gather of parts: a length every world divides (NCCL's
 *     ncclReduceScatter / ncclAllGather) and one none does (a group of one ncclReduce or
 *     ncclBroadcast per part, rooted at its owner), in f32 and bf16, larger than a slot;
 *   - avg over 3 ranks (1/3 is not exact): within a rounding and the same bits on every rank.
 * Then the mock NCCL called directly (1 and 3 ranks), for what dtrain does not use: every
 * datatype and op against a reference of the documented arithmetic, rooted reduce and
 * broadcast, reduce-scatter and all-gather in place, a group of reduces, sends and receives.
 * Then the failures: one rank never issues the all-reduce, and the others fail with dtrain's
 * collective timeout (1 s) within a few seconds instead of hanging; one rank is killed, and the
 * others fail with NCCL's asynchronous error (ncclRemoteError: the mock sees the peer gone)
 * long before their 60 s deadline; and the misuse the mock must report (its ranks exit 1):
 * ranks issuing different collectives, two ranks on one GPU, ranks disagreeing on nranks.
 * Each rank exits 0 when all its checks pass (a MOCK ERROR makes it exit 1); the parent checks
 * every exit status, and kills the ranks of a world that hangs. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <nccl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "cuda_ok.h"
#include "dtrain/bf16.h"
#include "dtrain/comm.h"


enum { GUARD = 64 };             /* elements after each buffer that nothing may write */
static const float GUARD_VAL = -7.25f;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* rank r's element i of data set `seed`: an integer in [-30, 30], so that a sum over 4 ranks
 * is exact in float and in bf16 (integers up to 256) */
static float ival(unsigned seed, int r, size_t i) {
    return (float)((int)((i * 7 + (size_t)r * 13 + (size_t)seed * 5) % 61) - 30);
}

/* a byte of rank r's data set `seed` */
static unsigned char bval(unsigned seed, int r, size_t i) { return (unsigned char)(i * 31 + (size_t)r * 101 + seed); }

typedef struct rank_ctx {
    int rank, world;
    dt_comm *boot, *c;
    cudaStream_t cs;
} rank_ctx;

static float *dev_floats(size_t n) {
    float *d = NULL;
    CUDA_OK(cudaMalloc((void **)&d, (n + GUARD) * sizeof(float)));
    return d;
}

static float *host_floats(size_t n) {
    float *h = malloc((n + GUARD) * sizeof(float));
    CHECK(h);
    return h;
}

/* h(n + GUARD) = this rank's data set, then the guard */
static void fill(const rank_ctx *x, float *h, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) h[i] = ival(seed, x->rank, i);
    for (size_t i = n; i < n + GUARD; i++) h[i] = GUARD_VAL;
}

/* the sum over every rank of element i */
static float sum_of(const rank_ctx *x, unsigned seed, size_t i) {
    float s = 0;
    for (int r = 0; r < x->world; r++) s += ival(seed, r, i);
    return s;
}

/* got[lo, hi) == want(i) bit for bit, and the guard after n untouched */
typedef float (*want_fn)(const rank_ctx *x, unsigned seed, size_t i);
static void check_range(const rank_ctx *x, const float *got, size_t lo, size_t hi, size_t n, want_fn want,
                        unsigned seed, const char *what) {
    for (size_t i = lo; i < hi; i++) {
        const float w = want(x, seed, i);
        if (memcmp(&got[i], &w, sizeof w) != 0) {
            fprintf(stderr, "rank %d of %d: %s: %zu floats, element %zu: got %.9g, expected %.9g\n", x->rank, x->world,
                    what, n, i, got[i], w);
            CHECK(0);
        }
    }
    for (size_t i = n; i < n + GUARD; i++)
        if (got[i] != GUARD_VAL) {
            fprintf(stderr, "rank %d of %d: %s: guard element %zu was overwritten (%.9g)\n", x->rank, x->world, what, i,
                    got[i]);
            CHECK(0);
        }
}

static float avg_of(const rank_ctx *x, unsigned seed, size_t i) { return sum_of(x, seed, i) / (float)x->world; }

/* the part owner's element i: what an all-gather of parts leaves everywhere */
static float owner_of(const rank_ctx *x, unsigned seed, size_t i) {
    (void)x;
    return (float)((int)((i * 3 + seed) % 53) - 26);
}

/* buf(n), device or host, as the host sees it */
static void to_host(float *h, const float *buf, size_t n, int dev) {
    if (dev) CUDA_OK(cudaMemcpy(h, buf, (n + GUARD) * sizeof(float), cudaMemcpyDeviceToHost));
    else memcpy(h, buf, (n + GUARD) * sizeof(float));
}
static void from_host(float *buf, const float *h, size_t n, int dev) {
    if (dev) CUDA_OK(cudaMemcpy(buf, h, (n + GUARD) * sizeof(float), cudaMemcpyHostToDevice));
    else memcpy(buf, h, (n + GUARD) * sizeof(float));
}

/* ---- all-reduce ---- */

/* sum and avg (exact where the world is a power of 2) of device and host buffers of 1 to 1000003
 * floats (two steps of the mock's slot); bf16 on the wire (sums of small integers stay exact) up to
 * 300007 floats */
static void test_allreduce(const rank_ctx *x) {
    const size_t lens[] = {1, 4099, 1000003};
    const int pow2 = (x->world & (x->world - 1)) == 0;
    unsigned seed = 1;
    for (int li = 0; li < 3; li++)
        for (int dev = 0; dev < 2; dev++)
            for (int kind = 0; kind < 3; kind++) { /* sum, avg, sum as bf16 */
                size_t n = lens[li];
                if (kind == 1 && !pow2) continue; /* test_avg_three */
                if (kind == 2 && n > 5000) { /* the mock's bf16 kernels are slow: one large one, smaller */
                    if (!dev) continue;
                    n = 300007;
                }
                float *h = host_floats(n), *buf = dev ? dev_floats(n) : host_floats(n);
                fill(x, h, n, seed);
                from_host(buf, h, n, dev);
                if (kind == 2) {
                    dt_comm_req *req;
                    CHECK_OK(dt_comm_allreduce_start(x->c, buf, n, DT_REDUCE_SUM, DT_WIRE_BF16, &req));
                    CHECK_OK(dt_comm_wait(x->c, req));
                } else {
                    CHECK_OK(dt_comm_allreduce(x->c, buf, n, kind ? DT_REDUCE_AVG : DT_REDUCE_SUM));
                }
                to_host(h, buf, n, dev);
                char what[96];
                snprintf(what, sizeof what, "%s all-reduce %s", dev ? "device" : "host",
                         kind == 0 ? "sum" : kind == 1 ? "avg" : "sum as bf16");
                check_range(x, h, 0, n, n, kind == 1 ? avg_of : sum_of, seed, what);
                if (dev) CUDA_OK(cudaFree(buf));
                else free(buf);
                free(h);
                seed++;
            }
}

/* several buckets in flight at once (started, then waited for), each with its own data */
static void test_buckets(const rank_ctx *x) {
    enum { K = 6 };
    const size_t lens[K] = {1000, 1, 700001, 5, 65536, 3};
    float *d[K], *h[K];
    dt_comm_req *req[K];
    for (int k = 0; k < K; k++) {
        h[k] = host_floats(lens[k]);
        fill(x, h[k], lens[k], 100 + (unsigned)k);
        d[k] = dev_floats(lens[k]);
        from_host(d[k], h[k], lens[k], 1);
    }
    for (int k = 0; k < K; k++)
        CHECK_OK(dt_comm_allreduce_start(x->c, d[k], lens[k], DT_REDUCE_SUM, k % 2 ? DT_WIRE_BF16 : DT_WIRE_F32,
                                         &req[k]));
    for (int k = 0; k < K; k++) {
        CHECK_OK(dt_comm_wait(x->c, req[k]));
        to_host(h[k], d[k], lens[k], 1);
        check_range(x, h[k], 0, lens[k], lens[k], sum_of, 100 + (unsigned)k, "bucket in flight");
        CUDA_OK(cudaFree(d[k]));
        free(h[k]);
    }
}

/* avg over a world that is not a power of 2: within a rounding of the exact mean, and the same
 * bits on every rank (the mock reduces in rank order everywhere) */
static void test_avg_three(const rank_ctx *x) {
    const size_t n = 700001;
    float *h = host_floats(n), *d = dev_floats(n);
    fill(x, h, n, 7);
    from_host(d, h, n, 1);
    CHECK_OK(dt_comm_allreduce(x->c, d, n, DT_REDUCE_AVG));
    to_host(h, d, n, 1);
    uint64_t hash = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        CHECK_NEAR_REL(h[i], (double)sum_of(x, 7, i) / x->world, 1e-6, 30); /* the inputs' size */
        uint32_t u;
        memcpy(&u, &h[i], sizeof u);
        hash = (hash ^ u) * 1099511628211ull;
    }
    uint64_t all[8];
    CHECK_OK(dt_comm_allgather(x->boot, &hash, sizeof hash, all));
    for (int r = 0; r < x->world; r++) CHECK(all[r] == hash);
    CUDA_OK(cudaFree(d));
    free(h);
}

/* ---- broadcast, all-gather ---- */

static void test_broadcast(const rank_ctx *x) {
    const size_t sizes[] = {1, 5000, ((size_t)5 << 20) + 3}; /* the last: three slots' worth of bytes */
    const int root = x->world - 1;
    for (int si = 0; si < 3; si++)
        for (int dev = 0; dev < 2; dev++) {
            const size_t b = sizes[si];
            unsigned char *h = malloc(b + GUARD), *buf = h;
            CHECK(h);
            for (size_t i = 0; i < b; i++) h[i] = x->rank == root ? bval(9, root, i) : (unsigned char)0xee;
            memset(h + b, 0xab, GUARD);
            if (dev) {
                CUDA_OK(cudaMalloc((void **)&buf, b + GUARD));
                CUDA_OK(cudaMemcpy(buf, h, b + GUARD, cudaMemcpyHostToDevice));
            }
            CHECK_OK(dt_comm_broadcast(x->c, buf, b, root));
            if (dev) CUDA_OK(cudaMemcpy(h, buf, b + GUARD, cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < b; i++)
                if (h[i] != bval(9, root, i)) {
                    fprintf(stderr, "rank %d: %s broadcast of %zu bytes from rank %d: byte %zu is %d, expected %d\n",
                            x->rank, dev ? "device" : "host", b, root, i, h[i], bval(9, root, i));
                    CHECK(0);
                }
            for (size_t i = b; i < b + GUARD; i++) CHECK_INT_EQ(h[i], 0xab);
            if (dev) CUDA_OK(cudaFree(buf));
            free(h);
        }
}

static void test_allgather(const rank_ctx *x) {
    const size_t sizes[] = {1, 301, ((size_t)3 << 20) + 5};
    for (int si = 0; si < 3; si++)
        for (int mix = 0; mix < 4; mix++) { /* host/device input x host/device output */
            const int in_dev = mix & 1, out_dev = mix >> 1;
            const size_t b = sizes[si], ob = b * (size_t)x->world;
            unsigned char *in = malloc(b), *out = malloc(ob + GUARD), *din = in, *dout = out;
            CHECK(in && out);
            for (size_t i = 0; i < b; i++) in[i] = bval(11, x->rank, i);
            memset(out, 0xee, ob + GUARD);
            if (in_dev) {
                CUDA_OK(cudaMalloc((void **)&din, b));
                CUDA_OK(cudaMemcpy(din, in, b, cudaMemcpyHostToDevice));
            }
            if (out_dev) {
                CUDA_OK(cudaMalloc((void **)&dout, ob + GUARD));
                CUDA_OK(cudaMemcpy(dout, out, ob + GUARD, cudaMemcpyHostToDevice));
            }
            CHECK_OK(dt_comm_allgather(x->c, din, b, dout));
            if (out_dev) CUDA_OK(cudaMemcpy(out, dout, ob + GUARD, cudaMemcpyDeviceToHost));
            for (int r = 0; r < x->world; r++)
                for (size_t i = 0; i < b; i++)
                    if (out[(size_t)r * b + i] != bval(11, r, i)) {
                        fprintf(stderr, "rank %d: all-gather of %zu bytes (%s in, %s out): rank %d's byte %zu is %d, "
                                "expected %d\n", x->rank, b, in_dev ? "device" : "host", out_dev ? "device" : "host", r,
                                i, out[(size_t)r * b + i], bval(11, r, i));
                        CHECK(0);
                    }
            for (size_t i = ob; i < ob + GUARD; i++) CHECK_INT_EQ(out[i], 0xee);
            if (in_dev) CUDA_OK(cudaFree(din));
            if (out_dev) CUDA_OK(cudaFree(dout));
            free(in);
            free(out);
        }
}

/* ---- reduce-scatter, all-gather of parts (ZeRO-1) ---- */

/* n = 3000000 is split evenly by 2, 3 and 4 ranks (ncclReduceScatter, ncclAllGather), 3000001 by
 * none (ncclReduce / ncclBroadcast per part in a group); both parts span more than one slot.
 * Device and host (staged) buffers; bf16 reduce-scatters of device buffers of 1200000 (parts
 * larger than a slot's share) and 300007 floats (the same two paths). */
static void test_parts(const rank_ctx *x) {
    const size_t lens[] = {3000000, 3000001, 1200000, 300007};
    unsigned seed = 20;
    for (int li = 0; li < 4; li++)
        for (int dev = 0; dev < 2; dev++) {
            const size_t n = lens[li];
            const int bf = li >= 2;
            if (bf && !dev) continue; /* the bf16 kernels are slow on the mock: device buffers only */
            size_t lo, hi;
            dt_comm_part(n, x->world, x->rank, &lo, &hi);
            float *h = host_floats(n), *buf = dev ? dev_floats(n) : host_floats(n);
            fill(x, h, n, seed);
            from_host(buf, h, n, dev);
            if (bf) {
                dt_comm_req *req;
                CHECK_OK(dt_comm_reduce_scatter_start(x->c, buf, n, DT_WIRE_BF16, &req));
                CHECK_OK(dt_comm_wait(x->c, req));
            } else {
                CHECK_OK(dt_comm_reduce_scatter(x->c, buf, n));
            }
            to_host(h, buf, n, dev);
            char what[96];
            snprintf(what, sizeof what, "%s reduce-scatter%s, part [%zu, %zu)", dev ? "device" : "host",
                     bf ? " as bf16" : "", lo, hi);
            check_range(x, h, lo, hi, n, sum_of, seed, what);
            seed++;
            if (bf) goto next;
            /* all-gather of parts: this rank's part holds the owners' values, the rest poison */
            for (size_t i = 0; i < n; i++) h[i] = i >= lo && i < hi ? owner_of(x, seed, i) : 1e30f;
            from_host(buf, h, n, dev);
            CHECK_OK(dt_comm_allgather_parts(x->c, buf, n));
            to_host(h, buf, n, dev);
            snprintf(what, sizeof what, "%s all-gather of parts", dev ? "device" : "host");
            check_range(x, h, 0, n, n, owner_of, seed, what);
            seed++;
        next:
            if (dev) CUDA_OK(cudaFree(buf));
            else free(buf);
            free(h);
        }
}

/* ---- the ranks ---- */

static void join(rank_ctx *x, dt_shm_world *w, int rank, int world, double timeout_s) {
    memset(x, 0, sizeof *x);
    x->rank = rank;
    x->world = world;
    int ndev = 0;
    CUDA_OK(cudaGetDeviceCount(&ndev));
    if (ndev < world) {
        fprintf(stderr, "rank %d: %d mock GPU(s), %d needed: run with MOCK_DEVICE_COUNT=4\n", rank, ndev, world);
        exit(1);
    }
    CUDA_OK(cudaSetDevice(rank));
    CUDA_OK(cudaStreamCreateWithFlags(&x->cs, cudaStreamNonBlocking));
    CHECK_OK(dt_comm_init_shm(&x->boot, w, rank, 60));
    CHECK_OK(dt_comm_init_nccl(&x->c, x->boot, rank, x->cs, timeout_s));
    CHECK_STR_EQ(dt_comm_backend(x->c), "nccl");
    CHECK_INT_EQ(dt_comm_rank(x->c), rank);
    CHECK_INT_EQ(dt_comm_world(x->c), world);
}

static void leave(rank_ctx *x) {
    dt_comm_free(x->c);
    dt_comm_free(x->boot);
    CUDA_OK(cudaStreamDestroy(x->cs));
}

static int rank_collectives(dt_shm_world *w, int rank, int world) {
    rank_ctx x;
    join(&x, w, rank, world, 60);
    const double t0 = now_s();
    test_allreduce(&x);
    test_buckets(&x);
    if (world == 3) test_avg_three(&x);
    test_broadcast(&x);
    test_allgather(&x);
    test_parts(&x);
    CHECK_OK(dt_comm_barrier(x.c));
    if (rank == 0) printf("  %d ranks: the collectives took %.1f s\n", world, now_s() - t0);
    leave(&x);
    return 0;
}

/* the last rank never issues the all-reduce: the others time out (1 s) instead of hanging */
static int rank_missing(dt_shm_world *w, int rank, int world) {
    rank_ctx x;
    join(&x, w, rank, world, 1.0);
    enum { N = 1000 };
    float *d = dev_floats(N), zeros[N + GUARD] = {0};
    from_host(d, zeros, N, 1);
    if (rank != world - 1) {
        const double t0 = now_s();
        CHECK_INT_EQ(dt_comm_allreduce(x.c, d, N, DT_REDUCE_SUM), DT_ERR_DEVICE);
        const double took = now_s() - t0;
        char msg[2048], want[128];
        snprintf(msg, sizeof msg, "%s", dt_error_msg());
        if (rank == 0) printf("  rank 0 after %.1f s: %s\n", took, msg);
        snprintf(want, sizeof want, "collective timeout: nccl all-reduce #1 (1000 floats, sum) on rank %d (host ",
                 rank);
        CHECK_STR_CONTAINS(msg, want);
        CHECK_STR_CONTAINS(msg, "did not finish in 1.0 s: a peer worker died, hung or stopped, or never issued");
        CHECK_STR_CONTAINS(msg, "the NCCL communicator was aborted");
        CHECK(took >= 1.0 && took < 10.0);
    }
    CHECK_OK(dt_comm_barrier(x.boot)); /* the missing rank waits here until the others have failed */
    CUDA_OK(cudaFree(d));
    leave(&x);
    return 0;
}

/* rank 1 is killed after the init: the others' all-reduce fails with NCCL's asynchronous error
 * (the mock's waiting collective sees the peer gone) long before the 60 s deadline */
static int rank_killed(dt_shm_world *w, int rank, int world) {
    rank_ctx x;
    join(&x, w, rank, world, 60);
    if (rank == 1) kill(getpid(), SIGKILL);
    enum { N = 1000 };
    float *d = dev_floats(N), zeros[N + GUARD] = {0};
    from_host(d, zeros, N, 1);
    const double t0 = now_s();
    CHECK_INT_EQ(dt_comm_allreduce(x.c, d, N, DT_REDUCE_SUM), DT_ERR_DEVICE);
    const double took = now_s() - t0;
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", dt_error_msg());
    if (rank == 0) printf("  rank 0 after %.1f s: %s\n", took, msg);
    CHECK_STR_CONTAINS(msg, "nccl all-reduce #1 (1000 floats, sum) on rank");
    CHECK_STR_CONTAINS(msg, "NCCL reports an asynchronous error: remote process exited or there was a network error "
                            "(ncclResult_t 6)");
    CHECK_STR_CONTAINS(msg, "rank 1 (process ");
    CHECK_STR_CONTAINS(msg, "the NCCL communicator was aborted");
    CHECK(took < 10.0);
    CUDA_OK(cudaFree(d));
    dt_comm_free(x.c);
    dt_comm_free(x.boot); /* no collective on it: rank 1 is gone */
    CUDA_OK(cudaStreamDestroy(x.cs));
    return 0;
}

/* ---- the mock NCCL itself: every datatype and op, rooted and grouped calls, sends and receives ----
 * dtrain sends floats, bf16 and bytes; the other datatypes and ops are checked here against a
 * reference of the reduction the mock documents: rank order 0..n-1, every partial result
 * rounded to the type (halves through _Float16, bf16 through dtrain/bf16.h), integers wrapping,
 * avg as NCCL computes it (floating types: each input times 1/n in the type, then the sum;
 * integers: the sum divided by n). */

static struct {
    ncclResult_t (*GetUniqueId)(ncclUniqueId *);
    ncclResult_t (*CommInitRank)(ncclComm_t *, int, ncclUniqueId, int);
    ncclResult_t (*CommDestroy)(ncclComm_t);
    ncclResult_t (*AllReduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*Reduce)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*ReduceScatter)(const void *, void *, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*AllGather)(const void *, void *, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
    ncclResult_t (*Broadcast)(const void *, void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*GroupStart)(void);
    ncclResult_t (*GroupEnd)(void);
    ncclResult_t (*Send)(const void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
    ncclResult_t (*Recv)(void *, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
} nc;

static void nc_load(void) {
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) fprintf(stderr, "dlopen libnccl.so.2: %s (LD_LIBRARY_PATH=$OUT?)\n", dlerror());
    CHECK(h);
#define SYM(f) CHECK((*(void **)&nc.f = dlsym(h, "nccl" #f)) != NULL)
    SYM(GetUniqueId);
    SYM(CommInitRank);
    SYM(CommDestroy);
    SYM(AllReduce);
    SYM(Reduce);
    SYM(ReduceScatter);
    SYM(AllGather);
    SYM(Broadcast);
    SYM(GroupStart);
    SYM(GroupEnd);
    SYM(Send);
    SYM(Recv);
#undef SYM
}

#define NC_OK(call)                                                                                   \
    do {                                                                                              \
        ncclResult_t r_ = (call);                                                                     \
        if (r_ != ncclSuccess) {                                                                      \
            fprintf(stderr, "%s:%d: %s failed: ncclResult_t %d\n", __FILE__, __LINE__, #call, (int)r_); \
            exit(1);                                                                                  \
        }                                                                                             \
    } while (0)

static const ncclDataType_t all_types[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
                                           ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16};
static const ncclRedOp_t all_ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};

static size_t tsize(ncclDataType_t t) {
    return t == ncclInt8 || t == ncclUint8 ? 1 : t == ncclFloat16 || t == ncclBfloat16 ? 2
         : t == ncclInt32 || t == ncclUint32 || t == ncclFloat32 ? 4 : 8;
}

typedef union {
    int8_t i8;
    uint8_t u8;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    _Float16 h;
    float f;
    double d;
    uint16_t b;
} elem_t;

/* rank r's element i of data set `seed` in type t: integers that wrap when summed or multiplied,
 * floating values with fractions (their sums round) */
static elem_t elem(ncclDataType_t t, unsigned seed, int r, size_t i) {
    const int k = (int)((i * 37 + (size_t)r * 11 + seed * 7) % 41) - 20; /* -20..20 */
    const double f = k * 0.37 + r * 0.013;
    elem_t e;
    memset(&e, 0, sizeof e);
    switch (t) {
    case ncclInt8: e.i8 = (int8_t)(k * 6); break;
    case ncclUint8: e.u8 = (uint8_t)((k + 20) * 6); break;
    case ncclInt32: e.i32 = k * 100003; break;
    case ncclUint32: e.u32 = (uint32_t)(k + 20) * 100000007u; break;
    case ncclInt64: e.i64 = (int64_t)k * 1000000000007; break;
    case ncclUint64: e.u64 = (uint64_t)(k + 20) * 1000000000000007u; break;
    case ncclFloat16: e.h = (_Float16)f; break;
    case ncclFloat32: e.f = (float)f; break;
    case ncclFloat64: e.d = f; break;
    default: e.b = dt_float_to_bf16((float)f); break;
    }
    return e;
}

static float fop(ncclRedOp_t op, float a, float b) {
    return op == ncclProd ? a * b : op == ncclMax ? (b > a ? b : a) : op == ncclMin ? (b < a ? b : a) : a + b;
}
static double dop(ncclRedOp_t op, double a, double b) {
    return op == ncclProd ? a * b : op == ncclMax ? (b > a ? b : a) : op == ncclMin ? (b < a ? b : a) : a + b;
}
#define IREF(m, T, U)                                                                                     \
    a.m = first ? x.m : op == ncclProd ? (T)((U)a.m * (U)x.m) : op == ncclMax ? (x.m > a.m ? x.m : a.m) \
        : op == ncclMin ? (x.m < a.m ? x.m : a.m) : (T)((U)a.m + (U)x.m)

/* the reduction over ranks 0..n-1 of element i, as the mock documents it */
static elem_t ref(ncclDataType_t t, ncclRedOp_t op, unsigned seed, int n, size_t i) {
    elem_t a;
    memset(&a, 0, sizeof a);
    const ncclRedOp_t sop = op == ncclAvg ? ncclSum : op;
    for (int r = 0; r < n; r++) {
        const elem_t x = elem(t, seed, r, i);
        const int first = r == 0;
        switch (t) {
        case ncclInt8: IREF(i8, int8_t, uint8_t); break;
        case ncclUint8: IREF(u8, uint8_t, unsigned); break;
        case ncclInt32: IREF(i32, int32_t, uint32_t); break;
        case ncclUint32: IREF(u32, uint32_t, uint32_t); break;
        case ncclInt64: IREF(i64, int64_t, uint64_t); break;
        case ncclUint64: IREF(u64, uint64_t, uint64_t); break;
        case ncclFloat32: {
            const float b = op == ncclAvg ? x.f * (float)(1.0 / n) : x.f;
            a.f = first ? b : fop(sop, a.f, b);
            break;
        }
        case ncclFloat64: {
            const double b = op == ncclAvg ? x.d * (1.0 / n) : x.d;
            a.d = first ? b : dop(sop, a.d, b);
            break;
        }
        case ncclFloat16: {
            const _Float16 b = op == ncclAvg ? (_Float16)((float)x.h * (float)(_Float16)(float)(1.0 / n)) : x.h;
            a.h = first ? b : (_Float16)fop(sop, (float)a.h, (float)b);
            break;
        }
        default: {
            const float s = dt_bf16_round((float)(1.0 / n));
            const uint16_t b = op == ncclAvg ? dt_float_to_bf16(dt_bf16_to_float(x.b) * s) : x.b;
            a.b = first ? b : dt_float_to_bf16(fop(sop, dt_bf16_to_float(a.b), dt_bf16_to_float(b)));
            break;
        }
        }
    }
    if (op == ncclAvg) switch (t) {
        case ncclInt8: a.i8 = (int8_t)(a.i8 / n); break;
        case ncclUint8: a.u8 = (uint8_t)(a.u8 / n); break;
        case ncclInt32: a.i32 /= n; break;
        case ncclUint32: a.u32 /= (uint32_t)n; break;
        case ncclInt64: a.i64 /= n; break;
        case ncclUint64: a.u64 /= (uint64_t)n; break;
        default: break;
        }
    return a;
}

/* a device buffer of `bytes` (+ GUARD) filled from h */
static void *dev_copy(const void *h, size_t bytes) {
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, bytes + GUARD));
    CUDA_OK(cudaMemcpy(d, h, bytes + GUARD, cudaMemcpyHostToDevice));
    return d;
}

/* d(bytes) = `byte` everywhere (the mock has no cudaMemset) */
static void dev_poison(void *d, int byte, size_t bytes) {
    unsigned char *h = malloc(bytes);
    CHECK(h);
    memset(h, byte, bytes);
    CUDA_OK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    free(h);
}

/* h(count) = rank r's data set in type t, then a guard of 0x5c bytes */
static unsigned char *host_elems(ncclDataType_t t, unsigned seed, int r, size_t count) {
    const size_t ts = tsize(t);
    unsigned char *h = malloc(count * ts + GUARD);
    CHECK(h);
    for (size_t i = 0; i < count; i++) {
        const elem_t e = elem(t, seed, r, i);
        memcpy(h + i * ts, &e, ts);
    }
    memset(h + count * ts, 0x5c, GUARD);
    return h;
}

/* got(count) holds want(i) for every i, and its guard is untouched */
static void check_elems(const unsigned char *got, size_t count, ncclDataType_t t, elem_t (*want)(void *, size_t),
                        void *arg, const char *what) {
    const size_t ts = tsize(t);
    for (size_t i = 0; i < count; i++) {
        const elem_t w = want(arg, i);
        if (memcmp(got + i * ts, &w, ts) != 0) {
            uint64_t g = 0, e = 0;
            memcpy(&g, got + i * ts, ts);
            memcpy(&e, &w, ts);
            fprintf(stderr, "%s: element %zu of %zu: got bits 0x%llx, expected 0x%llx\n", what, i, count,
                    (unsigned long long)g, (unsigned long long)e);
            CHECK(0);
        }
    }
    for (size_t i = 0; i < GUARD; i++) CHECK_INT_EQ(got[count * ts + i], 0x5c);
}

typedef struct want_arg { ncclDataType_t t; ncclRedOp_t op; unsigned seed; int n, r; size_t off; } want_arg;
static elem_t want_reduced(void *a, size_t i) {
    const want_arg *w = a;
    return ref(w->t, w->op, w->seed, w->n, w->off + i);
}
static elem_t want_rank(void *a, size_t i) { /* rank w->r's own input (untouched, broadcast) */
    const want_arg *w = a;
    return elem(w->t, w->seed, w->r, w->off + i);
}

/* ncclSend / ncclRecv (comm_nccl.c does not use them; the mock exports them): in a group, a
 * ring's shift of a message larger than the mock's per-peer part of a slot (in pieces), two
 * messages to the same peer (matched in issue order) and an all-to-all that includes this rank
 * itself; outside a group, rank 0 to rank 1 alone */
static void test_p2p(ncclComm_t comm, cudaStream_t s, int rank, int world, unsigned *seed) {
    const int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    const size_t big = 300001, small = 1001, ts = 4;
    unsigned char *h = host_elems(ncclFloat32, *seed, rank, big), *hb = host_elems(ncclFloat32, *seed + 1, rank, small);
    unsigned char *out = malloc(big * ts + GUARD);
    CHECK(out);
    memset(out, 0x5c, big * ts + GUARD);
    unsigned char *dsend = dev_copy(h, big * ts), *dsend2 = dev_copy(hb, small * ts), *drecv = dev_copy(out, big * ts);
    unsigned char *drecv2 = dev_copy(out, small * ts);
    NC_OK(nc.GroupStart());
    NC_OK(nc.Recv(drecv, big, ncclFloat32, prev, comm, s)); /* a receive first: the group must not wait on it */
    NC_OK(nc.Send(dsend, big, ncclFloat32, next, comm, s));
    NC_OK(nc.Send(dsend2, small, ncclFloat32, next, comm, s));
    NC_OK(nc.Recv(drecv2, small, ncclFloat32, prev, comm, s));
    NC_OK(nc.GroupEnd());
    CUDA_OK(cudaStreamSynchronize(s));
    want_arg wa = {ncclFloat32, ncclSum, *seed, world, prev, 0}, wb = {ncclFloat32, ncclSum, *seed + 1, world, prev, 0};
    char what[128];
    CUDA_OK(cudaMemcpy(out, drecv, big * ts + GUARD, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof what, "rank %d: ncclRecv of %zu floats from rank %d in a ring", rank, big, prev);
    check_elems(out, big, ncclFloat32, want_rank, &wa, what);
    CUDA_OK(cudaMemcpy(out, drecv2, small * ts + GUARD, cudaMemcpyDeviceToHost));
    snprintf(what, sizeof what, "rank %d: the second ncclRecv from rank %d in a ring", rank, prev);
    check_elems(out, small, ncclFloat32, want_rank, &wb, what);
    *seed += 2;

    /* all-to-all: part q of this rank's buffer to rank q, rank q's part `rank` into part q */
    const size_t part = 2003, all = part * (size_t)world;
    unsigned char *ha = host_elems(ncclInt32, *seed, rank, all), *da = dev_copy(ha, all * ts);
    memset(ha, 0x5c, all * ts + GUARD);
    unsigned char *db = dev_copy(ha, all * ts);
    NC_OK(nc.GroupStart());
    for (int q = 0; q < world; q++) {
        NC_OK(nc.Send(da + (size_t)q * part * ts, part, ncclInt32, q, comm, s));
        NC_OK(nc.Recv(db + (size_t)q * part * ts, part, ncclInt32, q, comm, s));
    }
    NC_OK(nc.GroupEnd());
    CUDA_OK(cudaStreamSynchronize(s));
    CUDA_OK(cudaMemcpy(ha, db, all * ts + GUARD, cudaMemcpyDeviceToHost));
    for (int q = 0; q < world; q++) {
        want_arg wq = {ncclInt32, ncclSum, *seed, world, q, (size_t)rank * part};
        snprintf(what, sizeof what, "rank %d: all-to-all, the part from rank %d", rank, q);
        for (size_t i = 0; i < part; i++) {
            const elem_t e = want_rank(&wq, i);
            if (memcmp(ha + ((size_t)q * part + i) * ts, &e, ts) != 0) {
                fprintf(stderr, "%s: element %zu is wrong\n", what, i);
                CHECK(0);
            }
        }
    }
    for (size_t i = 0; i < GUARD; i++) CHECK_INT_EQ(ha[all * ts + i], 0x5c);
    (*seed)++;

    /* outside a group: rank 0 sends to rank 1, which receives; the others take no part */
    if (world > 1 && rank <= 1) {
        if (rank == 0) NC_OK(nc.Send(dsend, big, ncclFloat32, 1, comm, s));
        else NC_OK(nc.Recv(drecv, big, ncclFloat32, 0, comm, s));
        CUDA_OK(cudaStreamSynchronize(s));
        if (rank == 1) {
            want_arg w0 = {ncclFloat32, ncclSum, *seed - 3, world, 0, 0}; /* rank 0's ring message */
            CUDA_OK(cudaMemcpy(out, drecv, big * ts + GUARD, cudaMemcpyDeviceToHost));
            check_elems(out, big, ncclFloat32, want_rank, &w0, "rank 1: ncclRecv from rank 0 outside a group");
        }
    }
    unsigned char *bufs[] = {dsend, dsend2, drecv, drecv2, da, db};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) CUDA_OK(cudaFree(bufs[i]));
    free(h);
    free(hb);
    free(ha);
    free(out);
}

/* every datatype x op, all-reduce out of place (one in place per type); 600001 floats (two
 * slots); reduce to root 1 (the other ranks' output untouched); reduce-scatter in place over two
 * steps and avg of int64; all-gather in place; broadcast out of place from the last rank; a
 * group of reduces rooted at every rank (comm_nccl.c's uneven reduce-scatter); sends and
 * receives */
static int rank_direct(dt_shm_world *w, int rank, int world) {
    rank_ctx x;
    join(&x, w, rank, world, 60); /* dtrain's communicator (it loads the library) beside ours */
    nc_load();
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0) NC_OK(nc.GetUniqueId(&id));
    CHECK_OK(dt_comm_broadcast(x.boot, &id, sizeof id, 0));
    ncclComm_t comm;
    NC_OK(nc.CommInitRank(&comm, world, id, rank));
    cudaStream_t s = x.cs;
    char what[160];
    unsigned seed = 1;
    for (size_t ti = 0; ti < sizeof all_types / sizeof all_types[0]; ti++)
        for (size_t oi = 0; oi < sizeof all_ops / sizeof all_ops[0]; oi++, seed++) {
            const ncclDataType_t t = all_types[ti];
            const ncclRedOp_t op = all_ops[oi];
            const int in_place = op == ncclSum;
            const size_t count = t == ncclFloat32 && op == ncclSum ? 600001 : 1001, ts = tsize(t);
            unsigned char *h = host_elems(t, seed, rank, count), *send = dev_copy(h, count * ts);
            unsigned char *recv = in_place ? send : dev_copy(h, count * ts);
            if (!in_place) dev_poison(recv, 0x77, count * ts);
            NC_OK(nc.AllReduce(send, recv, count, t, op, comm, s));
            CUDA_OK(cudaStreamSynchronize(s));
            CUDA_OK(cudaMemcpy(h, recv, count * ts + GUARD, cudaMemcpyDeviceToHost));
            want_arg wa = {t, op, seed, world, rank, 0};
            snprintf(what, sizeof what, "rank %d: ncclAllReduce type %d op %d%s", rank, (int)t, (int)op,
                     in_place ? " in place" : "");
            check_elems(h, count, t, want_reduced, &wa, what);
            if (!in_place) CUDA_OK(cudaFree(recv));
            CUDA_OK(cudaFree(send));
            free(h);
        }

    { /* reduce to root 1 (0 in a world of one): float32 sum, int32 max */
        const int root = world > 1;
        const ncclDataType_t ts_[2] = {ncclFloat32, ncclInt32};
        const ncclRedOp_t ops[2] = {ncclSum, ncclMax};
        for (int k = 0; k < 2; k++, seed++) {
            const size_t count = 70001, ts = tsize(ts_[k]);
            unsigned char *h = host_elems(ts_[k], seed, rank, count), *send = dev_copy(h, count * ts);
            unsigned char *recv = dev_copy(h, count * ts); /* the input's values: untouched off the root */
            NC_OK(nc.Reduce(send, recv, count, ts_[k], ops[k], root, comm, s));
            CUDA_OK(cudaStreamSynchronize(s));
            CUDA_OK(cudaMemcpy(h, recv, count * ts + GUARD, cudaMemcpyDeviceToHost));
            want_arg wa = {ts_[k], ops[k], seed, world, rank, 0};
            snprintf(what, sizeof what, "rank %d: ncclReduce to rank %d, type %d op %d", rank, root, (int)ts_[k],
                     (int)ops[k]);
            check_elems(h, count, ts_[k], rank == root ? want_reduced : want_rank, &wa, what);
            CUDA_OK(cudaFree(send));
            CUDA_OK(cudaFree(recv));
            free(h);
        }
    }
    { /* reduce-scatter in place (recvbuff = sendbuff + rank * recvcount): float32 sum over two
       * steps, int64 avg */
        const ncclDataType_t ts_[2] = {ncclFloat32, ncclInt64};
        const ncclRedOp_t ops[2] = {ncclSum, ncclAvg};
        const size_t counts[2] = {300007, 999};
        for (int k = 0; k < 2; k++, seed++) {
            const size_t count = counts[k], ts = tsize(ts_[k]), all = count * (size_t)world;
            unsigned char *h = host_elems(ts_[k], seed, rank, all), *send = dev_copy(h, all * ts);
            NC_OK(nc.ReduceScatter(send, send + (size_t)rank * count * ts, count, ts_[k], ops[k], comm, s));
            CUDA_OK(cudaStreamSynchronize(s));
            CUDA_OK(cudaMemcpy(h, send, all * ts + GUARD, cudaMemcpyDeviceToHost));
            want_arg wa = {ts_[k], ops[k], seed, world, rank, (size_t)rank * count};
            snprintf(what, sizeof what, "rank %d: ncclReduceScatter in place, type %d op %d", rank, (int)ts_[k],
                     (int)ops[k]);
            for (size_t i = 0; i < count; i++) {
                const elem_t e = want_reduced(&wa, i);
                if (memcmp(h + ((size_t)rank * count + i) * ts, &e, ts) != 0) {
                    fprintf(stderr, "%s: element %zu of %zu is wrong\n", what, i, count);
                    CHECK(0);
                }
            }
            for (size_t i = 0; i < GUARD; i++) CHECK_INT_EQ(h[all * ts + i], 0x5c);
            CUDA_OK(cudaFree(send));
            free(h);
        }
    }
    { /* all-gather in place: sendbuff = recvbuff + rank * sendcount */
        const size_t count = 777, all = count * (size_t)world;
        unsigned char *h = malloc(all + GUARD);
        CHECK(h);
        memset(h, 0x33, all);
        memset(h + all, 0x5c, GUARD);
        for (size_t i = 0; i < count; i++) h[(size_t)rank * count + i] = elem(ncclUint8, seed, rank, i).u8;
        unsigned char *d = dev_copy(h, all);
        NC_OK(nc.AllGather(d + (size_t)rank * count, d, count, ncclUint8, comm, s));
        CUDA_OK(cudaStreamSynchronize(s));
        CUDA_OK(cudaMemcpy(h, d, all + GUARD, cudaMemcpyDeviceToHost));
        for (int r = 0; r < world; r++) {
            want_arg wa = {ncclUint8, ncclSum, seed, world, r, 0};
            for (size_t i = 0; i < count; i++) CHECK_INT_EQ(h[(size_t)r * count + i], want_rank(&wa, i).u8);
        }
        for (size_t i = 0; i < GUARD; i++) CHECK_INT_EQ(h[all + i], 0x5c);
        CUDA_OK(cudaFree(d));
        free(h);
        seed++;
    }
    { /* broadcast out of place from the last rank, float64 */
        const size_t count = 5000, ts = 8;
        const int root = world - 1;
        unsigned char *h = host_elems(ncclFloat64, seed, rank, count), *send = dev_copy(h, count * ts);
        unsigned char *recv = dev_copy(h, count * ts);
        dev_poison(recv, 0x11, count * ts);
        NC_OK(nc.Broadcast(send, recv, count, ncclFloat64, root, comm, s));
        CUDA_OK(cudaStreamSynchronize(s));
        CUDA_OK(cudaMemcpy(h, recv, count * ts + GUARD, cudaMemcpyDeviceToHost));
        want_arg wa = {ncclFloat64, ncclSum, seed, world, root, 0};
        snprintf(what, sizeof what, "rank %d: ncclBroadcast from rank %d", rank, root);
        check_elems(h, count, ncclFloat64, want_rank, &wa, what);
        CUDA_OK(cudaFree(send));
        CUDA_OK(cudaFree(recv));
        free(h);
        seed++;
    }
    { /* a group: one in-place reduce per part, part q rooted at rank q (bf16 sums) */
        const size_t part = 1003, all = part * (size_t)world, ts = 2;
        unsigned char *h = host_elems(ncclBfloat16, seed, rank, all), *d = dev_copy(h, all * ts);
        NC_OK(nc.GroupStart());
        for (int q = 0; q < world; q++)
            NC_OK(nc.Reduce(d + (size_t)q * part * ts, d + (size_t)q * part * ts, part, ncclBfloat16, ncclSum, q, comm,
                            s));
        NC_OK(nc.GroupEnd());
        CUDA_OK(cudaStreamSynchronize(s));
        CUDA_OK(cudaMemcpy(h, d, all * ts + GUARD, cudaMemcpyDeviceToHost));
        want_arg wa = {ncclBfloat16, ncclSum, seed, world, rank, 0};
        snprintf(what, sizeof what, "rank %d: grouped ncclReduce per part (bf16)", rank);
        for (size_t i = 0; i < all; i++) {
            const int mine = i / part == (size_t)rank;
            const elem_t e = mine ? want_reduced(&wa, i) : want_rank(&wa, i);
            if (memcmp(h + i * ts, &e, ts) != 0) {
                fprintf(stderr, "%s: element %zu (%s part) is wrong\n", what, i, mine ? "its own" : "another rank's");
                CHECK(0);
            }
        }
        for (size_t i = 0; i < GUARD; i++) CHECK_INT_EQ(h[all * ts + i], 0x5c);
        CUDA_OK(cudaFree(d));
        free(h);
        seed++;
    }
    test_p2p(comm, s, rank, world, &seed);
    NC_OK(nc.CommDestroy(comm));
    leave(&x);
    return 0;
}

/* ---- misuse the mock reports (MOCK ERROR: the rank exits 1) ---- */

/* GPU `dev`, the shm world, and the unique id from rank 0 */
static ncclUniqueId boot_only(rank_ctx *x, dt_shm_world *w, int rank, int world, int dev) {
    memset(x, 0, sizeof *x);
    x->rank = rank;
    x->world = world;
    CUDA_OK(cudaSetDevice(dev));
    CHECK_OK(dt_comm_init_shm(&x->boot, w, rank, 60));
    nc_load();
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0) NC_OK(nc.GetUniqueId(&id));
    CHECK_OK(dt_comm_broadcast(x->boot, &id, sizeof id, 0));
    return id;
}

/* rank 0 all-reduces 10 floats, rank 1 11: both report the mismatch (and still complete) */
static int rank_mismatch(dt_shm_world *w, int rank, int world) {
    rank_ctx x;
    const ncclUniqueId id = boot_only(&x, w, rank, world, rank);
    ncclComm_t comm;
    NC_OK(nc.CommInitRank(&comm, world, id, rank));
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    unsigned char h[11 * sizeof(float) + GUARD] = {0};
    float *d = dev_copy(h, 11 * sizeof(float));
    NC_OK(nc.AllReduce(d, d, 10 + (size_t)rank, ncclFloat32, ncclSum, comm, s));
    CUDA_OK(cudaStreamSynchronize(s));
    NC_OK(nc.CommDestroy(comm));
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaStreamDestroy(s));
    dt_comm_free(x.boot);
    return 0;
}

/* both ranks on GPU 0: NCCL's "Duplicate GPU detected", ncclInvalidUsage on both */
static int rank_same_gpu(dt_shm_world *w, int rank, int world) {
    rank_ctx x;
    const ncclUniqueId id = boot_only(&x, w, rank, world, 0);
    ncclComm_t comm;
    CHECK_INT_EQ(nc.CommInitRank(&comm, world, id, rank), ncclInvalidUsage);
    dt_comm_free(x.boot);
    return 0;
}

/* rank 1 says nranks 3: the second to arrive (rank 1, usually) is refused at once, the first
 * gives up waiting for its peer after MOCK_NCCL_INIT_TIMEOUT_S (2 s here) with ncclSystemError,
 * instead of hanging */
static int rank_nranks(dt_shm_world *w, int rank, int world) {
    rank_ctx x;
    const ncclUniqueId id = boot_only(&x, w, rank, world, rank);
    setenv("MOCK_NCCL_INIT_TIMEOUT_S", "2", 1);
    if (rank) usleep(200000);
    ncclComm_t comm;
    const double t0 = now_s();
    const ncclResult_t r = nc.CommInitRank(&comm, rank ? 3 : 2, id, rank);
    CHECK(r == ncclInvalidUsage || r == ncclSystemError);
    if (r == ncclSystemError) CHECK(now_s() - t0 >= 2.0 && now_s() - t0 < 10.0);
    dt_comm_free(x.boot);
    return 0;
}

/* ---- the worlds ---- */

typedef int (*rank_fn)(dt_shm_world *w, int rank, int world);

#define WORLD_LIMIT_S 180.0 /* a world still running after this long is killed: a hang */

/* Forks `world` ranks running fn (no CUDA here before the fork). Every rank must exit with
 * `want` (0; 1 where the mock reports on purpose), but `killed` (-1: none), which must die of
 * SIGKILL; want_err (NULL: not captured): what the ranks' stderr must hold. A rank that fails
 * has the others killed 3 s later (they would wait for it), and so has a world that hangs. */
static void run_world(const char *name, int world, rank_fn fn, int killed, int want, const char *want_err) {
    printf("%s, %d ranks:\n", name, world);
    fflush(stdout);
    dt_shm_world *w;
    CHECK_OK(dt_shm_world_create(&w, world, 0));
    char err_path[] = "/tmp/test_nccl_ranks.XXXXXX";
    const int err_fd = want_err ? mkstemp(err_path) : -1;
    CHECK(!want_err || err_fd >= 0);
    pid_t pid[8];
    for (int r = 0; r < world; r++) {
        pid[r] = fork();
        CHECK(pid[r] >= 0);
        if (pid[r] == 0) {
            if (err_fd >= 0) dup2(err_fd, 2);
            exit(fn(w, r, world));
        }
    }
    int status[8], done[8] = {0}, left = world - (killed >= 0), bad = 0, shot = 0;
    const double t0 = now_s();
    double kill_at = t0 + WORLD_LIMIT_S;
    while (left > 0) { /* the killed rank is reaped last: a zombie meanwhile, which the mock must see as dead */
        for (int r = 0; r < world; r++) {
            if (done[r] || r == killed || waitpid(pid[r], &status[r], WNOHANG) != pid[r]) continue;
            done[r] = 1;
            left--;
            const int ok = WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == want;
            if (!ok && kill_at > now_s() + 3) kill_at = now_s() + 3; /* the others would wait for it */
        }
        if (left > 0 && !shot && now_s() > kill_at) {
            fprintf(stderr, "%s, %d ranks: killing the ranks still running after %.0f s\n", name, world, now_s() - t0);
            for (int r = 0; r < world; r++)
                if (!done[r]) kill(pid[r], SIGKILL);
            shot = 1;
        }
        usleep(10000);
    }
    if (killed >= 0) CHECK(waitpid(pid[killed], &status[killed], 0) == pid[killed]);
    for (int r = 0; r < world; r++) {
        const int ok = r == killed ? WIFSIGNALED(status[r]) && WTERMSIG(status[r]) == SIGKILL
                                   : WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == want;
        if (!ok) {
            fprintf(stderr, "%s, %d ranks: rank %d %s %d\n", name, world, r,
                    WIFEXITED(status[r]) ? "exited with status" : "was killed by signal",
                    WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : WTERMSIG(status[r]));
            bad = 1;
        }
    }
    dt_shm_world_destroy(w);
    if (want_err) {
        char text[16384];
        const ssize_t n = pread(err_fd, text, sizeof text - 1, 0);
        text[n > 0 ? n : 0] = '\0';
        close(err_fd);
        unlink(err_path);
        const char *line = strstr(text, "MOCK ERROR");
        if (line) printf("  %.*s\n", (int)strcspn(line, "\n"), line);
        if (!strstr(text, want_err)) {
            fprintf(stderr, "%s: the ranks' stderr lacks \"%s\":\n%s\n", name, want_err, text);
            bad = 1;
        }
    }
    CHECK(!bad);
    printf("%s, %d ranks: ok\n", name, world);
}

int main(void) {
    for (int world = 2; world <= 4; world++) run_world("collectives", world, rank_collectives, -1, 0, NULL);
    for (int world = 1; world <= 3; world += 2) /* one rank: copies, and sends to itself */
        run_world("the mock NCCL directly: every datatype and op, rooted and grouped calls, send/recv", world,
                  rank_direct, -1, 0, NULL);
    run_world("a rank that never issues the all-reduce: the others time out", 3, rank_missing, -1, 0, NULL);
    run_world("a rank killed: the others see NCCL's asynchronous error", 3, rank_killed, 1, 0, NULL);
    run_world("ranks that issue different collectives (reported)", 2, rank_mismatch, -1, 1,
              "every rank must issue the same collectives");
    run_world("two ranks on one GPU (reported)", 2, rank_same_gpu, -1, 1, "Duplicate GPU detected");
    run_world("ranks that disagree on nranks (reported; the other gives up after 2 s)", 2, rank_nranks, -1, 1,
              "every rank must pass the same nranks");
    TEST_PASS("test_nccl_ranks");
}
