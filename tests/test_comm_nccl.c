/* test_comm_nccl.c — (label gpu) the nccl collective backend with one worker (world 1) on
 * GPU 0, booted over a shm communicator: all-reduce (sum, avg) of device, pageable, pinned
 * and managed buffers, buckets started then waited, broadcast, all-gather in every mix of
 * host and device buffers, barrier, ordering after the compute stream, and a timeout that
 * aborts the NCCL communicator. Skips (77) without a usable GPU.
 *
 * With one rank every collective is the identity, so a backend that does nothing would pass
 * plain in-place checks. What catches a broken one here:
 *   - out-of-place all-gathers into poisoned outputs (nothing copied, wrong offset, no D2H);
 *   - host buffers: each call has new values, so a missed H2D reduces stale staging data;
 *   - guard elements after every buffer (a count in bytes instead of floats, a wrong size);
 *   - avg over one rank must be the input bit for bit (a wrong scale or op);
 *   - the compute stream writes the input after a 300 ms host-function sleep just before the
 *     collective: without the wait on that stream NCCL reads the old values, or the call
 *     returns too early;
 *   - a 1 GiB all-gather with a microsecond deadline must fail as a timeout, abort, and make
 *     the next call fail at once with the same message, leaving the GPU usable;
 *   - several buckets in flight: with the compute stream held shut, every bucket started must be
 *     queued with NCCL before the first one can complete (the mock NCCL counts them; a real one
 *     cannot be asked), and each must still have waited for its own input; with a short deadline
 *     the oldest times out and the others in flight fail with it;
 *   - the exposed time (dt_comm_last_exposed_ms) of a bucket whose input the compute stream
 *     wrote after 300 ms must leave those 300 ms out, which the host's wait cannot. */
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "cuda_ok.h"
#include "dtrain/bf16.h"
#include "dtrain/comm.h"


enum { GUARD = 64 };                 /* elements after each buffer that nothing may write */
static const float GUARD_VAL = -7.25f;
static unsigned g_seed = 1;          /* new values for every call */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* element i of data set `seed`: many mantissa bits, both signs */
static float val(unsigned seed, size_t i) {
    uint32_t h = (uint32_t)i * 2654435761u ^ (seed * 40503u + 0x9e3779b9u);
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return ((float)h * (1.0f / 4294967296.0f) - 0.5f) * (1.0f + 0.37f * (float)(seed % 7));
}

static void fill(float *h, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) h[i] = val(seed, i);
    for (size_t i = n; i < n + GUARD; i++) h[i] = GUARD_VAL;
}

/* got(n + GUARD) == want(n) bit for bit, then the guard untouched */
static void check_bits(const float *got, const float *want, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            fprintf(stderr, "%s: %zu floats, element %zu: got %.9g, expected %.9g\n", what, n, i, got[i], want[i]);
            CHECK(0);
        }
    for (size_t i = n; i < n + GUARD; i++)
        if (got[i] != GUARD_VAL) {
            fprintf(stderr, "%s: %zu floats: guard element %zu was overwritten (%.9g)\n", what, n, i, got[i]);
            CHECK(0);
        }
}

static float *dev_floats(size_t n) {
    float *d = NULL;
    CUDA_OK(cudaMalloc((void **)&d, (n + GUARD) * sizeof(float)));
    return d;
}

static void upload(float *d, const float *h, size_t n) {
    CUDA_OK(cudaMemcpy(d, h, (n + GUARD) * sizeof(float), cudaMemcpyHostToDevice));
}

static void download(float *h, const float *d, size_t n) {
    CUDA_OK(cudaMemcpy(h, d, (n + GUARD) * sizeof(float), cudaMemcpyDeviceToHost));
}

static dt_comm *join_nccl(dt_comm *boot, cudaStream_t cs, double timeout_s) {
    dt_comm *c = NULL;
    dt_status st = dt_comm_init_nccl(&c, boot, 0, cs, timeout_s);
    if (st != DT_OK) fprintf(stderr, "dt_comm_init_nccl: %s\n", dt_error_msg());
    CHECK_INT_EQ(st, DT_OK);
    CHECK(c != NULL);
    CHECK_STR_EQ(dt_comm_backend(c), "nccl");
    CHECK_INT_EQ(dt_comm_rank(c), 0);
    CHECK_INT_EQ(dt_comm_world(c), 1);
    return c;
}

/* ---- all-reduce ---- */

/* SUM and AVG over lengths 0, 1, 1000003 on device memory: one rank, so the input */
static void test_allreduce_device(dt_comm *c) {
    const size_t lens[] = {0, 1, 1000003};
    for (int li = 0; li < 3; li++)
        for (int opi = 0; opi < 2; opi++) {
            size_t n = lens[li];
            dt_reduce_op op = opi ? DT_REDUCE_AVG : DT_REDUCE_SUM;
            float *want = malloc((n + GUARD) * sizeof(float)), *got = malloc((n + GUARD) * sizeof(float));
            CHECK(want && got);
            fill(want, n, g_seed++);
            float *d = dev_floats(n);
            upload(d, want, n);
            CHECK_OK(dt_comm_allreduce(c, n ? d : NULL, n, op));
            download(got, d, n);
            check_bits(got, want, n, opi ? "device all-reduce avg" : "device all-reduce sum");
            CUDA_OK(cudaFree(d));
            free(want);
            free(got);
        }
    printf("all-reduce sum/avg of device memory, lengths 0, 1, 1000003: ok\n");
}

/* One rank's reduce-scatter and all-gather of parts (ZeRO-1's pair: its part is everything,
 * so the input), and DT_WIRE_BF16 (training.grad_comm_dtype: bf16): the gradients go through
 * the cast kernel, NCCL's bf16 all-reduce / reduce-scatter and back, so one rank's result is
 * its input rounded to bf16, for device and host buffers. */
static void test_parts_bf16(dt_comm *c) {
    const size_t lens[] = {0, 1, 1000003};
    for (int li = 0; li < 3; li++) {
        const size_t n = lens[li];
        float *want = malloc((n + GUARD) * sizeof(float)), *got = malloc((n + GUARD) * sizeof(float));
        float *rounded = malloc((n + GUARD) * sizeof(float));
        CHECK(want && got && rounded);
        fill(want, n, g_seed++);
        for (size_t i = 0; i < n; i++) rounded[i] = dt_bf16_round(want[i]);
        float *d = dev_floats(n);
        upload(d, want, n);
        CHECK_OK(dt_comm_reduce_scatter(c, n ? d : NULL, n));
        CHECK_OK(dt_comm_allgather_parts(c, n ? d : NULL, n));
        download(got, d, n);
        check_bits(got, want, n, "device reduce-scatter + all-gather of parts");
        for (int kind = 0; kind < 2; kind++) {
            dt_comm_req *req;
            upload(d, want, n);
            if (kind == 0) CHECK_OK(dt_comm_allreduce_start(c, n ? d : NULL, n, DT_REDUCE_SUM, DT_WIRE_BF16, &req));
            else CHECK_OK(dt_comm_reduce_scatter_start(c, n ? d : NULL, n, DT_WIRE_BF16, &req));
            CHECK_OK(dt_comm_wait(c, req));
            download(got, d, n);
            check_bits(got, rounded, n, kind ? "device bf16 reduce-scatter" : "device bf16 all-reduce");
        }
        float *h = malloc((n + GUARD) * sizeof(float)); /* pageable host memory: staged */
        CHECK(h);
        memcpy(h, want, (n + GUARD) * sizeof(float));
        dt_comm_req *req;
        CHECK_OK(dt_comm_allreduce_start(c, n ? h : NULL, n, DT_REDUCE_AVG, DT_WIRE_BF16, &req));
        CHECK_OK(dt_comm_wait(c, req));
        check_bits(h, rounded, n, "host bf16 all-reduce avg");
        free(h);
        CUDA_OK(cudaFree(d));
        free(want);
        free(got);
        free(rounded);
    }
    printf("reduce-scatter + all-gather of parts, bf16 all-reduce and reduce-scatter, lengths 0, 1, 1000003: ok\n");
}

enum { MEM_PAGEABLE, MEM_PINNED, MEM_MANAGED };

static float *host_floats(int kind, size_t n) {
    float *p = NULL;
    size_t bytes = (n + GUARD) * sizeof(float);
    if (kind == MEM_PAGEABLE) p = malloc(bytes);
    else if (kind == MEM_PINNED) CUDA_OK(cudaMallocHost((void **)&p, bytes));
    else CUDA_OK(cudaMallocManaged((void **)&p, bytes, cudaMemAttachGlobal));
    CHECK(p);
    return p;
}

static void host_free(int kind, float *p) {
    if (kind == MEM_PAGEABLE) free(p);
    else if (kind == MEM_PINNED) CUDA_OK(cudaFreeHost(p));
    else CUDA_OK(cudaFree(p));
}

/* Host buffers are staged through the backend's device buffer: the large one grows it; the
 * small ones after it find stale data there, which a missed upload would return. */
static void test_allreduce_host(dt_comm *c) {
    static const char *const names[] = {"pageable", "pinned", "managed"};
    const size_t lens[] = {0, 1, 1000003, 4099, 1};
    for (int kind = 0; kind < 3; kind++)
        for (int li = 0; li < 5; li++)
            for (int opi = 0; opi < 2; opi++) {
                size_t n = lens[li];
                dt_reduce_op op = opi ? DT_REDUCE_AVG : DT_REDUCE_SUM;
                float *want = malloc((n + GUARD) * sizeof(float)), *buf = host_floats(kind, n);
                CHECK(want);
                fill(want, n, g_seed++);
                memcpy(buf, want, (n + GUARD) * sizeof(float));
                CHECK_OK(dt_comm_allreduce(c, n ? buf : NULL, n, op));
                char what[96];
                snprintf(what, sizeof what, "%s all-reduce %s", names[kind], opi ? "avg" : "sum");
                check_bits(buf, want, n, what);
                host_free(kind, buf);
                free(want);
            }
    printf("all-reduce sum/avg of pageable, pinned and managed memory, lengths 0, 1, 1000003, 4099, 1: ok\n");
}

/* AVG over one rank is the input bit for bit: -0, the largest and smallest normal floats,
 * infinities, values with full mantissas. (Subnormals are left out: NCCL's kernels may
 * flush them to zero.) */
static void test_avg_exact(dt_comm *c) {
    enum { N = 1000 };
    static const float special[] = {1.0f, -0.0f, 0.0f, 3.4028235e38f, -3.4028235e38f, 1.17549435e-38f,
                                    -1.17549435e-38f, 0.1f, 1e-30f, INFINITY, -INFINITY, 16777217.0f};
    const size_t ns = sizeof special / sizeof special[0];
    float want[N + GUARD], got[N + GUARD];
    fill(want, N, g_seed++);
    for (size_t i = 0; i < N; i += 7) want[i] = special[(i / 7) % ns];
    float *d = dev_floats(N);
    upload(d, want, N);
    CHECK_OK(dt_comm_allreduce(c, d, N, DT_REDUCE_AVG));
    download(got, d, N);
    check_bits(got, want, N, "device avg over one rank");
    memcpy(got, want, sizeof got);
    CHECK_OK(dt_comm_allreduce(c, got, N, DT_REDUCE_AVG));
    check_bits(got, want, N, "host avg over one rank");
    CUDA_OK(cudaFree(d));
    printf("avg over one rank is the input bit for bit: ok\n");
}

/* Buckets: several starts, a blocking broadcast in between, waits in issue order. */
static void test_async(dt_comm *c) {
    enum { NB = 5 };
    const size_t lens[NB] = {1000, 1, 70000, 0, 5};
    const dt_reduce_op ops[NB] = {DT_REDUCE_SUM, DT_REDUCE_AVG, DT_REDUCE_SUM, DT_REDUCE_SUM, DT_REDUCE_AVG};
    float *want[NB], *d[NB];
    dt_comm_req *req[NB];
    for (int k = 0; k < NB; k++) {
        want[k] = malloc((lens[k] + GUARD) * sizeof(float));
        CHECK(want[k]);
        fill(want[k], lens[k], g_seed++);
        d[k] = dev_floats(lens[k]);
        upload(d[k], want[k], lens[k]);
    }
    unsigned char bc[10000];
    for (size_t i = 0; i < sizeof bc; i++) bc[i] = (unsigned char)(i * 7 + 3);
    CHECK_OK(dt_comm_allreduce_start(c, d[0], lens[0], ops[0], DT_WIRE_F32, &req[0]));
    CHECK_OK(dt_comm_allreduce_start(c, d[1], lens[1], ops[1], DT_WIRE_F32, &req[1]));
    CHECK_OK(dt_comm_broadcast(c, bc, sizeof bc, 0)); /* queued behind buckets 0 and 1 */
    for (int k = 2; k < NB; k++) CHECK_OK(dt_comm_allreduce_start(c, lens[k] ? d[k] : NULL, lens[k], ops[k], DT_WIRE_F32, &req[k]));
    for (int k = 0; k < NB; k++) {
        CHECK_OK(dt_comm_wait(c, req[k]));
        float *got = malloc((lens[k] + GUARD) * sizeof(float));
        CHECK(got);
        download(got, d[k], lens[k]);
        check_bits(got, want[k], lens[k], "bucket");
        free(got);
        free(want[k]);
        CUDA_OK(cudaFree(d[k]));
    }
    for (size_t i = 0; i < sizeof bc; i++) CHECK_INT_EQ(bc[i], (unsigned char)(i * 7 + 3));
    printf("async buckets + broadcast in between: ok\n");
}

/* ---- broadcast, all-gather, barrier ---- */

static void test_bcast_gather_barrier(dt_comm *c) {
    enum { B = 5000, PER = 301, G = 256 };
    unsigned char want[B], h[B + G], got[B + G];
    for (int i = 0; i < B; i++) want[i] = (unsigned char)(i * 13 + 1);
    memcpy(h, want, B);
    memset(h + B, 0xab, G);
    CHECK_OK(dt_comm_broadcast(c, h, B, 0));
    CHECK(memcmp(h, want, B) == 0);
    for (int i = 0; i < G; i++) CHECK_INT_EQ(h[B + i], 0xab);
    unsigned char *d = NULL;
    CUDA_OK(cudaMalloc((void **)&d, B + G));
    CUDA_OK(cudaMemcpy(d, h, B + G, cudaMemcpyHostToDevice));
    CHECK_OK(dt_comm_broadcast(c, d, B, 0));
    CHECK_OK(dt_comm_broadcast(c, NULL, 0, 0));
    CUDA_OK(cudaMemcpy(got, d, B + G, cudaMemcpyDeviceToHost));
    CHECK(memcmp(got, h, B + G) == 0);
    CUDA_OK(cudaFree(d));

    /* all-gather: host/device input x host/device output, out of place into poisoned
     * outputs, then in place (in == out + rank * bytes) */
    unsigned char in[PER], out[PER + G];
    for (int i = 0; i < PER; i++) in[i] = (unsigned char)(i * 31 + 5);
    unsigned char *din = NULL, *dout = NULL;
    CUDA_OK(cudaMalloc((void **)&din, PER));
    CUDA_OK(cudaMalloc((void **)&dout, PER + G));
    CUDA_OK(cudaMemcpy(din, in, PER, cudaMemcpyHostToDevice));
    for (int mix = 0; mix < 4; mix++) {
        const int in_dev = mix & 1, out_dev = mix >> 1;
        memset(out, 0xee, sizeof out);
        CUDA_OK(cudaMemcpy(dout, out, PER + G, cudaMemcpyHostToDevice));
        CHECK_OK(dt_comm_allgather(c, in_dev ? (void *)din : (void *)in, PER, out_dev ? (void *)dout : (void *)out));
        if (out_dev) CUDA_OK(cudaMemcpy(out, dout, PER + G, cudaMemcpyDeviceToHost));
        if (memcmp(out, in, PER) != 0) {
            fprintf(stderr, "all-gather from %s to %s memory: wrong bytes\n", in_dev ? "device" : "host",
                    out_dev ? "device" : "host");
            CHECK(0);
        }
        for (int i = 0; i < G; i++) CHECK_INT_EQ(out[PER + i], 0xee);
    }
    memcpy(out, in, PER); /* in place, host then device */
    CHECK_OK(dt_comm_allgather(c, out, PER, out));
    CHECK(memcmp(out, in, PER) == 0);
    CUDA_OK(cudaMemcpy(dout, in, PER, cudaMemcpyHostToDevice));
    CHECK_OK(dt_comm_allgather(c, dout, PER, dout));
    CUDA_OK(cudaMemcpy(out, dout, PER, cudaMemcpyDeviceToHost));
    CHECK(memcmp(out, in, PER) == 0);
    CHECK_OK(dt_comm_allgather(c, in, 0, out));
    CUDA_OK(cudaFree(din));
    CUDA_OK(cudaFree(dout));

    for (int k = 0; k < 20; k++) CHECK_OK(dt_comm_barrier(c));
    CHECK_OK(dt_comm_barrier_timeout(c, 5));
    printf("broadcast, all-gather (host/device mixes, in place), barrier: ok\n");
}

/* ---- ordering after the compute stream ---- */

static void CUDART_CB sleep_300ms(void *arg) {
    (void)arg;
    struct timespec t = {0, 300000000L};
    while (nanosleep(&t, &t) != 0) {}
}

/* The compute stream sleeps 300 ms (a host function), then writes the input; the collective
 * is issued right after, on the host. It must see the new input and must not return before
 * the compute stream got there. */
static void test_ordering(dt_comm *c, cudaStream_t cs) {
    enum { N = 1 << 20 };
    const size_t bytes = N * sizeof(float);
    float *a = malloc((N + GUARD) * sizeof(float)), *b = malloc((N + GUARD) * sizeof(float));
    float *got = malloc((N + GUARD) * sizeof(float));
    CHECK(a && b && got);
    fill(a, N, g_seed++);
    fill(b, N, g_seed++);
    float *d_in = dev_floats(N), *d_out = dev_floats(N), *d_b = dev_floats(N);
    upload(d_in, a, N);
    upload(d_out, a, N);
    upload(d_b, b, N);

    /* device input, out of place: an all-gather that runs early copies the old input */
    CUDA_OK(cudaLaunchHostFunc(cs, sleep_300ms, NULL));
    CUDA_OK(cudaMemcpyAsync(d_in, d_b, bytes, cudaMemcpyDeviceToDevice, cs));
    double t0 = now_s();
    CHECK_OK(dt_comm_allgather(c, d_in, bytes, d_out));
    double dt = now_s() - t0;
    CUDA_OK(cudaStreamSynchronize(cs));
    download(got, d_out, N);
    check_bits(got, b, N, "all-gather after the compute stream wrote its input");
    if (dt < 0.25) {
        fprintf(stderr, "the all-gather returned after %.3f s, before the compute stream's 300 ms of work\n", dt);
        CHECK(0);
    }

    /* pinned host input written by the compute stream (D2H): checked as soon as the wait
     * returns, before anything synchronizes the compute stream */
    float *h = host_floats(MEM_PINNED, N);
    memcpy(h, a, (N + GUARD) * sizeof(float));
    CUDA_OK(cudaLaunchHostFunc(cs, sleep_300ms, NULL));
    CUDA_OK(cudaMemcpyAsync(h, d_b, bytes, cudaMemcpyDeviceToHost, cs));
    dt_comm_req *req;
    t0 = now_s();
    CHECK_OK(dt_comm_allreduce_start(c, h, N, DT_REDUCE_SUM, DT_WIRE_F32, &req));
    CHECK_OK(dt_comm_wait(c, req));
    dt = now_s() - t0;
    check_bits(h, b, N, "host all-reduce after the compute stream wrote its input");
    CHECK(dt >= 0.25);
    CUDA_OK(cudaStreamSynchronize(cs));

    /* device all-reduce (avg) of a buffer the compute stream writes (cudaMemsetAsync) */
    CUDA_OK(cudaLaunchHostFunc(cs, sleep_300ms, NULL));
    CUDA_OK(cudaMemsetAsync(d_in, 0, bytes, cs)); /* +0.0f everywhere */
    t0 = now_s();
    CHECK_OK(dt_comm_allreduce_start(c, d_in, N, DT_REDUCE_AVG, DT_WIRE_F32, &req));
    CHECK_OK(dt_comm_wait(c, req));
    dt = now_s() - t0;
    CHECK(dt >= 0.25); /* in place over one rank, the values alone cannot tell */
    /* its exposed time leaves out the compute it waited for: on the device, from the memset's end */
    const double exposed = dt_comm_last_exposed_ms(c);
    printf("  host's wait %.1f ms, exposed (device) %.3f ms\n", dt * 1e3, exposed);
    CHECK(isfinite(exposed) && exposed >= 0 && exposed < 250);
    CUDA_OK(cudaStreamSynchronize(cs));
    download(got, d_in, N);
    for (size_t i = 0; i < N; i++) CHECK(got[i] == 0.0f && !signbit(got[i]));

    host_free(MEM_PINNED, h);
    CUDA_OK(cudaFree(d_in));
    CUDA_OK(cudaFree(d_out));
    CUDA_OK(cudaFree(d_b));
    free(a);
    free(b);
    free(got);
    printf("collectives run after the compute stream's work (device and pinned host inputs): ok\n");
}

/* Overlap (variant): the comm thread is kept busy for 300 ms by bucket 0 (it waits for a
 * host-function sleep queued before it) while bucket 1 is written and started and the compute
 * stream is given 2 x 300 ms more; bucket 1 must wait only for what was queued before its start
 * (done at ~0.3 s), not for the later work (done at ~0.9 s), whenever the comm thread gets to it. */
static void test_overlap(dt_comm *c, cudaStream_t cs) {
    enum { N = 4096 };
    float *d0 = dev_floats(N), *d1 = dev_floats(N), *d2 = dev_floats(N), *h = malloc((N + GUARD) * sizeof(float));
    CHECK(h);
    dt_comm_req *r0, *r1, *r2;
    double t0 = now_s();
    CUDA_OK(cudaLaunchHostFunc(cs, sleep_300ms, NULL));
    CUDA_OK(cudaMemsetAsync(d0, 0, N * sizeof(float), cs));
    CHECK_OK(dt_comm_allreduce_start(c, d0, N, DT_REDUCE_SUM, DT_WIRE_F32, &r0));
    CUDA_OK(cudaMemsetAsync(d1, 0, N * sizeof(float), cs));
    CHECK_OK(dt_comm_allreduce_start(c, d1, N, DT_REDUCE_SUM, DT_WIRE_F32, &r1));
    CUDA_OK(cudaLaunchHostFunc(cs, sleep_300ms, NULL));
    CUDA_OK(cudaLaunchHostFunc(cs, sleep_300ms, NULL));
    CUDA_OK(cudaMemsetAsync(d2, 0, N * sizeof(float), cs));
    CHECK_OK(dt_comm_allreduce_start(c, d2, N, DT_REDUCE_SUM, DT_WIRE_F32, &r2));
    CHECK_OK(dt_comm_wait(c, r0));
    CHECK_OK(dt_comm_wait(c, r1));
    double t1 = now_s() - t0;
    CHECK_OK(dt_comm_wait(c, r2));
    double t2 = now_s() - t0;
    if (t1 >= 0.6 || t2 < 0.85) {
        fprintf(stderr, "overlap: bucket 1 finished after %.3f s (expected ~0.3 s, well before the 0.9 s of later "
                "work), bucket 2 after %.3f s (expected after it)\n", t1, t2);
        CHECK(0);
    }
    CUDA_OK(cudaStreamSynchronize(cs));
    download(h, d1, N);
    for (size_t i = 0; i < N; i++) CHECK(h[i] == 0.0f);
    CUDA_OK(cudaFree(d0));
    CUDA_OK(cudaFree(d1));
    CUDA_OK(cudaFree(d2));
    free(h);
    printf("a bucket waits only for the work queued before its start (overlap): %.3f s vs %.3f s: ok\n", t1, t2);
}

/* ---- several buckets in flight ---- */

/* A host function that holds its stream until the test opens the gate. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open;
} gate;

static void CUDART_CB gate_wait(void *arg) {
    gate *g = arg;
    pthread_mutex_lock(&g->mu);
    while (!g->open) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_init(gate *g) {
    CHECK(pthread_mutex_init(&g->mu, NULL) == 0);
    CHECK(pthread_cond_init(&g->cv, NULL) == 0);
    g->open = 0;
}

static void gate_open(gate *g) {
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

/* The mock NCCL's counts (mock_nccl.c), NULL with a real NCCL: collectives queued on their
 * streams and not yet run, now and at most since the last call. */
static unsigned long (*mock_queued_now)(void);
static unsigned long (*mock_max_queued)(void);

static void find_mock_counts(void) {
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_NOLOAD); /* the one comm_nccl.c opened */
    if (!h) return;
    *(void **)&mock_queued_now = dlsym(h, "mock_nccl_queued_now");
    *(void **)&mock_max_queued = dlsym(h, "mock_nccl_max_queued");
    if (!mock_queued_now || !mock_max_queued) mock_queued_now = NULL, mock_max_queued = NULL;
}

/* With the mock: waits (up to 10 s) until `want` collectives are queued with NCCL at once;
 * with a real NCCL, which cannot be asked, gives the comm thread 200 ms. */
static void await_queued(unsigned long want) {
    const struct timespec nap = {0, 1000000L};
    if (!mock_queued_now) {
        const struct timespec t = {0, 200000000L};
        nanosleep(&t, NULL);
        return;
    }
    const double t0 = now_s();
    while (mock_queued_now() < want && now_s() - t0 < 10) nanosleep(&nap, NULL);
    if (mock_queued_now() != want) {
        fprintf(stderr, "in flight: %lu collectives queued with NCCL while the compute stream is held, expected %lu "
                "(the comm thread waits for each one before it issues the next)\n", mock_queued_now(), want);
        CHECK(0);
    }
}

/* K buckets (all-reduces fp32 and bf16, sum and avg, and reduce-scatters) started while the
 * compute stream is held shut, each after the compute stream writes its input: all K are
 * queued with NCCL before any can run (at most 32, comm_nccl.c's N_FLIGHT, at once: the 33rd
 * waits until the first has landed); once the gate opens each holds its own input's sum
 * (bf16: rounded), waited for last bucket first. */
static void test_in_flight(dt_comm *c, cudaStream_t cs) {
    enum { K = 40, CAP = 32, N = 3001 };
    float *want[K], *src[K], *d[K], *got = malloc((N + GUARD) * sizeof(float));
    dt_comm_req *req[K];
    CHECK(got);
    CHECK_OK(dt_comm_reserve(c, N)); /* bf16 buckets in flight share the wire buffer */
    for (int k = 0; k < K; k++) { /* everything that could wait for the device, before the gate */
        want[k] = malloc((N + GUARD) * sizeof(float));
        CHECK(want[k]);
        fill(want[k], N, g_seed++);
        src[k] = dev_floats(N);
        upload(src[k], want[k], N);
        d[k] = dev_floats(N);
    }
    gate g;
    gate_init(&g);
    if (mock_max_queued) (void)mock_max_queued(); /* from now on */
    CUDA_OK(cudaLaunchHostFunc(cs, gate_wait, &g));
    for (int k = 0; k < K; k++) {
        CUDA_OK(cudaMemcpyAsync(d[k], src[k], (N + GUARD) * sizeof(float), cudaMemcpyDeviceToDevice, cs));
        const dt_wire wire = k % 3 == 1 ? DT_WIRE_BF16 : DT_WIRE_F32;
        if (k % 5 == 4) CHECK_OK(dt_comm_reduce_scatter_start(c, d[k], N, wire, &req[k]));
        else CHECK_OK(dt_comm_allreduce_start(c, d[k], N, k % 2 ? DT_REDUCE_AVG : DT_REDUCE_SUM, wire, &req[k]));
    }
    await_queued(CAP);
    gate_open(&g);
    for (int k = K - 1; k >= 0; k--) CHECK_OK(dt_comm_wait(c, req[k]));
    const unsigned long most = mock_max_queued ? mock_max_queued() : 0;
    for (int k = 0; k < K; k++) {
        if (k % 3 == 1) /* bf16: one rank's sum is its input rounded */
            for (size_t i = 0; i < N; i++) want[k][i] = dt_bf16_round(want[k][i]);
        download(got, d[k], N);
        check_bits(got, want[k], N, "bucket in flight");
        CUDA_OK(cudaFree(d[k]));
        CUDA_OK(cudaFree(src[k]));
        free(want[k]);
    }
    free(got);
    if (mock_max_queued) {
        printf("  the mock NCCL had at most %lu of %d buckets queued at once\n", most, K);
        CHECK_INT_EQ(most, CAP);
    }
    printf("%d buckets in flight (32 at once), each after its own input, waited for in reverse: ok\n", K);
}

static void CUDART_CB sleep_1s(void *arg) {
    (void)arg;
    struct timespec t = {1, 0};
    while (nanosleep(&t, &t) != 0) {}
}

/* A 0.2 s deadline while buckets are in flight behind 1 s of compute work (a host function: not
 * a gate held shut, which NCCL's abort, freeing device memory, could wait for): the oldest times
 * out naming the compute stream, the others in flight fail with the same message, and so does a
 * later call, at once; the GPU stays usable. */
static void test_in_flight_timeout(dt_comm *boot, cudaStream_t cs) {
    enum { K = 3, N = 1000 };
    dt_comm *c = join_nccl(boot, cs, 0.2);
    float *d = dev_floats(N);
    CHECK_OK(dt_comm_allreduce(c, d, N, DT_REDUCE_SUM)); /* the comm thread's first: it sets the device */
    CUDA_OK(cudaLaunchHostFunc(cs, sleep_1s, NULL));
    dt_comm_req *req[K];
    for (int k = 0; k < K; k++) CHECK_OK(dt_comm_allreduce_start(c, d, N, DT_REDUCE_SUM, DT_WIRE_F32, &req[k]));
    await_queued(K);
    CHECK_INT_EQ(dt_comm_wait(c, req[0]), DT_ERR_DEVICE);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", dt_error_msg());
    printf("  %s\n", msg);
    CHECK_STR_CONTAINS(msg, "collective timeout: nccl all-reduce #2 (1000 floats, sum) on rank 0 (host ");
    CHECK_STR_CONTAINS(msg, "waited 0.2 s for the GPU work queued before it on the compute stream");
    CHECK_STR_CONTAINS(msg, "the NCCL communicator was aborted");
    for (int k = 1; k < K; k++) {
        CHECK_INT_EQ(dt_comm_wait(c, req[k]), DT_ERR_DEVICE);
        CHECK_STR_EQ(dt_error_msg(), msg);
    }
    const double t0 = now_s();
    CHECK_INT_EQ(dt_comm_allreduce(c, d, N, DT_REDUCE_SUM), DT_ERR_DEVICE);
    CHECK(now_s() - t0 < 0.1);
    CHECK_STR_EQ(dt_error_msg(), msg);
    CUDA_OK(cudaStreamSynchronize(cs));
    dt_comm_free(c);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(d));
    printf("a timeout with buckets in flight fails them all and aborts: ok\n");
}

/* ---- timeout: abort, fail at once afterwards, the GPU still usable ---- */

static void test_timeout(dt_comm *boot, cudaStream_t cs) {
    const size_t bytes = (size_t)1 << 30;
    void *din = NULL, *dout = NULL;
    if (cudaMalloc(&din, bytes) != cudaSuccess || cudaMalloc(&dout, bytes) != cudaSuccess) {
        (void)cudaGetLastError();
        cudaFree(din);
        printf("timeout: skipped (no room for 2 GiB on the GPU)\n");
        return;
    }
    int timed_out = 0;
    for (int attempt = 0; attempt < 5 && !timed_out; attempt++) {
        dt_comm *c = join_nccl(boot, cs, 1e-6); /* a 1 GiB copy takes far longer */
        dt_status st = dt_comm_allgather(c, din, bytes, dout);
        if (st == DT_OK) { /* finished before the first poll: try again */
            dt_comm_free(c);
            continue;
        }
        timed_out = 1;
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", dt_error_msg());
        printf("  %s\n", msg);
        CHECK_INT_EQ(st, DT_ERR_DEVICE);
        CHECK_STR_CONTAINS(msg, "collective timeout: nccl all-gather #1 (1073741824 bytes per rank) on rank 0 (host ");
        /* the first poll may come before the GPU passed the (empty) compute stream's event */
        if (!strstr(msg, "did not finish in 0.0 s: a peer worker died"))
            CHECK_STR_CONTAINS(msg, "waited 0.0 s for the GPU work queued before it on the compute stream");
        CHECK_STR_CONTAINS(msg, "training.collective_timeout_s");
        CHECK_STR_CONTAINS(msg, "the NCCL communicator was aborted");
        double t0 = now_s();
        CHECK_INT_EQ(dt_comm_barrier(c), DT_ERR_DEVICE); /* broken: at once, same message */
        CHECK(now_s() - t0 < 0.1);
        CHECK_STR_EQ(dt_error_msg(), msg);
        dt_comm_free(c);
    }
    CHECK(timed_out);
    CUDA_OK(cudaDeviceSynchronize()); /* the abort left the context usable */
    CUDA_OK(cudaFree(din));
    CUDA_OK(cudaFree(dout));
    printf("timeout aborts the NCCL communicator, later calls fail at once: ok\n");
}

/* ---- round trip of a tiny collective (information, not an assertion) ---- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void timing(dt_comm *c) {
    enum { IT = 200 };
    float *d = dev_floats(1);
    double t[IT];
    for (int i = 0; i < IT; i++) {
        double t0 = now_s();
        CHECK_OK(dt_comm_allreduce(c, d, 1, DT_REDUCE_SUM));
        t[i] = now_s() - t0;
    }
    qsort(t, IT, sizeof t[0], cmp_double);
    printf("timing: 1-float device all-reduce, start to wait (one rank): median %.1f us, p90 %.1f us\n",
           t[IT / 2] * 1e6, t[IT * 9 / 10] * 1e6);
    CUDA_OK(cudaFree(d));
}

int main(void) {
    int ndev = 0;
    cudaError_t e = cudaGetDeviceCount(&ndev);
    if (e != cudaSuccess || ndev == 0) {
        printf("no usable GPU (%s): skipped\n", e != cudaSuccess ? cudaGetErrorString(e) : "no devices");
        return 77;
    }
    CUDA_OK(cudaSetDevice(0));
    cudaStream_t cs;
    CUDA_OK(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking));

    dt_shm_world *w;
    CHECK_OK(dt_shm_world_create(&w, 1, 0));
    dt_comm *boot;
    CHECK_OK(dt_comm_init_shm(&boot, w, 0, 30));
    dt_comm *c = join_nccl(boot, cs, 30);
    find_mock_counts();
    CHECK(isnan(dt_comm_last_exposed_ms(boot))); /* a host backend measures no exposed time */

    test_allreduce_device(c);
    test_allreduce_host(c);
    test_avg_exact(c);
    test_parts_bf16(c);
    test_async(c);
    test_bcast_gather_barrier(c);
    test_ordering(c, cs);
    test_overlap(c, cs);
    test_in_flight(c, cs);
    test_in_flight_timeout(boot, cs);
    test_timeout(boot, cs);
    CHECK_OK(dt_comm_barrier(c)); /* the other communicator's abort left this one alone */
    timing(c);

    /* one more start that is never waited for: dt_comm_free finishes it first */
    float *last = dev_floats(300);
    dt_comm_req *never_waited;
    CHECK_OK(dt_comm_allreduce_start(c, last, 300, DT_REDUCE_SUM, DT_WIRE_F32, &never_waited));
    dt_comm_free(c);
    CUDA_OK(cudaFree(last));

    dt_comm_free(boot);
    dt_shm_world_destroy(w);
    CUDA_OK(cudaStreamDestroy(cs));
    TEST_PASS("test_comm_nccl");
}
