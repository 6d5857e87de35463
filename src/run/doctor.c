/* doctor.c — `dtrain doctor`: devices, collective self-test and bandwidth tables (all-reduce,
 * reduce-scatter, all-gather of parts). */
#include "dtrain/doctor.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtrain/clock.h"
#include "dtrain/backend.h"
#include "dtrain/comm.h"
#include "dtrain/device.h"
#ifdef DTRAIN_HAVE_MPI
#include "dtrain/comm_mpi.h"
#endif
#include "dtrain/launch.h"

/* rank r's test value at index i: exact in float, different per rank and index */
static float test_value(int r, size_t i) { return (float)(r + 1) * 0.5f + (float)(i % 97) * 0.25f; }

static dt_status check_allreduce(dt_comm *c, size_t n) {
    const int world = dt_comm_world(c), rank = dt_comm_rank(c);
    float *x = dt_malloc((n ? n : 1) * sizeof(float), "self-test buffer");
    if (!x) return DT_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) x[i] = test_value(rank, i);
    dt_status st = dt_comm_allreduce(c, x, n, DT_REDUCE_SUM);
    for (size_t i = 0; st == DT_OK && i < n; i++) {
        float want = 0.0f; /* the serial sum, in rank order */
        for (int r = 0; r < world; r++) want += test_value(r, i);
        if (x[i] != want)
            st = dt_error_set(DT_ERR_INTERNAL, "self-test failed: all-reduce of %zu floats over %d workers: element %zu "
                              "is %.9g, the serial sum is %.9g", n, world, i, x[i], want);
    }
    free(x);
    return st;
}

/* ZeRO-1's pair: a reduce-scatter leaves this rank's part (dt_comm_part) holding the serial
 * sum; an all-gather of parts then gives every rank every owner's part. */
static dt_status check_parts(dt_comm *c, size_t n) {
    const int world = dt_comm_world(c), rank = dt_comm_rank(c);
    float *x = dt_malloc((n ? n : 1) * sizeof(float), "self-test buffer");
    if (!x) return DT_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) x[i] = test_value(rank, i);
    size_t lo, hi;
    dt_comm_part(n, world, rank, &lo, &hi);
    dt_status st = dt_comm_reduce_scatter(c, x, n);
    for (size_t i = lo; st == DT_OK && i < hi; i++) {
        float want = 0.0f;
        for (int r = 0; r < world; r++) want += test_value(r, i);
        if (x[i] != want)
            st = dt_error_set(DT_ERR_INTERNAL, "self-test failed: reduce-scatter of %zu floats over %d workers: element "
                              "%zu (rank %d's part) is %.9g, the serial sum is %.9g", n, world, i, rank, x[i], want);
    }
    /* even after a failure: the others are in the all-gather */
    for (size_t i = 0; i < n; i++) x[i] = i >= lo && i < hi ? test_value(rank + world, i) : -1.0f;
    dt_status g = dt_comm_allgather_parts(c, x, n);
    if (st == DT_OK) st = g;
    for (int q = 0; st == DT_OK && q < world; q++) {
        size_t qlo, qhi;
        dt_comm_part(n, world, q, &qlo, &qhi);
        for (size_t i = qlo; st == DT_OK && i < qhi; i++)
            if (x[i] != test_value(q + world, i))
                st = dt_error_set(DT_ERR_INTERNAL, "self-test failed: all-gather of parts of %zu floats over %d workers: "
                                  "element %zu (rank %d's part) is %.9g on rank %d, not %.9g", n, world, i, q, x[i],
                                  rank, test_value(q + world, i));
    }
    free(x);
    return st;
}

static dt_status check_broadcast_gather(dt_comm *c) {
    const int world = dt_comm_world(c), rank = dt_comm_rank(c), root = world - 1;
    unsigned char buf[12345];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = rank == root ? (unsigned char)(i * 7 + 3) : 0;
    DT_TRY(dt_comm_broadcast(c, buf, sizeof buf, root));
    for (size_t i = 0; i < sizeof buf; i++)
        if (buf[i] != (unsigned char)(i * 7 + 3))
            return dt_error_set(DT_ERR_INTERNAL, "self-test failed: broadcast from rank %d: byte %zu differs on rank %d",
                                root, i, rank);
    int ids[DT_MAX_WORLD], me = rank * 1000 + 7;
    DT_TRY(dt_comm_allgather(c, &me, sizeof me, ids));
    for (int r = 0; r < world; r++)
        if (ids[r] != r * 1000 + 7)
            return dt_error_set(DT_ERR_INTERNAL, "self-test failed: all-gather: slot %d holds %d on rank %d", r, ids[r],
                                rank);
    return dt_comm_barrier(c);
}

enum { T_ALLREDUCE, T_REDUCE_SCATTER, T_GATHER_PARTS, T_KINDS, T_SEND = T_KINDS };

static dt_status timed(dt_comm *c, int kind, float *x, size_t n) {
    switch (kind) {
    case T_ALLREDUCE: return dt_comm_allreduce(c, x, n, DT_REDUCE_SUM);
    case T_SEND: return dt_comm_broadcast(c, x, n * sizeof(float), 0); /* two ranks: rank 0 sends, rank 1 receives */
    case T_REDUCE_SCATTER: return dt_comm_reduce_scatter(c, x, n);
    default: return dt_comm_allgather_parts(c, x, n);
    }
}

/* One collective's table, sizes 1 KiB .. max_bytes of the whole buffer. busbw as nccl-tests
 * defines it: algbw x 2(n-1)/n for an all-reduce, x (n-1)/n for a reduce-scatter or an
 * all-gather (the data each rank's link carries). x: max_bytes of host memory (shm) or device
 * memory (nccl). */
static dt_status bandwidth_table(dt_comm *c, int kind, float *x, long max_bytes) {
    static const char *const titles[T_KINDS + 1] = {"all-reduce (sum, float32)", "reduce-scatter (sum, float32)",
                                                    "all-gather of parts (float32)", "send (float32)"};
    const int world = dt_comm_world(c), rank = dt_comm_rank(c);
    dt_status st = DT_OK;
    if (rank == 0) {
        printf("\n%s, %d workers, %s:\n", titles[kind], world, dt_comm_backend(c));
        printf("%12s %10s %12s %12s %12s\n", "size", "iters", "time (us)", "algbw (GB/s)", "busbw (GB/s)");
    }
    const double factor = kind == T_SEND ? 1.0 : (kind == T_ALLREDUCE ? 2.0 : 1.0) * (world - 1) / world;
    for (size_t bytes = 1024; bytes <= (size_t)max_bytes && st == DT_OK; bytes *= 4) {
        size_t n = bytes / sizeof(float);
        int iters = bytes <= (1 << 20) ? 50 : bytes <= (16 << 20) ? 10 : 3;
        if ((st = timed(c, kind, x, n)) != DT_OK) break; /* warm-up */
        if ((st = dt_comm_barrier(c)) != DT_OK) break;
        double t0 = dt_clock_now();
        for (int k = 0; k < iters && st == DT_OK; k++) st = timed(c, kind, x, n);
        /* a collective ends for nobody before every rank joined it: rank 0's time is the job's */
        double t = (dt_clock_now() - t0) / iters;
        if (rank == 0 && st == DT_OK) {
            double algbw = (double)bytes / t / 1e9, busbw = algbw * factor;
            char size[32];
            if (bytes >= (1 << 20)) snprintf(size, sizeof size, "%zu MiB", bytes >> 20);
            else snprintf(size, sizeof size, "%zu KiB", bytes >> 10);
            printf("%12s %10d %12.1f %12.2f %12.2f\n", size, iters, t * 1e6, algbw, busbw);
            fflush(stdout);
        }
    }
    return st;
}

/* The self-test and the tables over `c`, with `buf` (max_bytes) for the tables. */
static dt_status self_test(dt_comm *c, void *buf, long max_bytes) {
    const size_t lengths[] = {0, 1, (size_t)(dt_comm_world(c) > 1 ? dt_comm_world(c) - 1 : 2), 1000003};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) DT_TRY(check_allreduce(c, lengths[i]));
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) DT_TRY(check_parts(c, lengths[i]));
    DT_TRY(check_broadcast_gather(c));
    if (dt_comm_rank(c) == 0) {
        printf("self-test: all-reduce, reduce-scatter and all-gather of parts (0, 1, n-1, 1000003 floats), broadcast, "
               "all-gather, barrier: ok\n");
        fflush(stdout);
    }
    if (dt_comm_world(c) == 1) { /* one worker sends nothing: a bandwidth would be memcpy's, not the collective's */
        printf("\nall-reduce bandwidth: not measured with 1 worker (nothing crosses between workers; "
               "--num-workers 2 or more)\n");
        return DT_OK;
    }
    for (int k = 0; k < T_KINDS; k++) DT_TRY(bandwidth_table(c, k, buf, max_bytes));
    return DT_OK;
}

typedef struct doctor_arg {
    long max_bytes;
    double timeout_s;
    dt_device_kind kind;
    int tp, pp; /* --tensor-parallel, --pipeline-parallel (1: none) */
} doctor_arg;

/* --tensor-parallel, --pipeline-parallel: the checks over this rank's tensor-parallel group (T > 1)
 * and (with more than one replica) its data-parallel group, every group at once; then the
 * all-reduce table of rank 0's groups (theirs only: the other groups' ranks skip it). buf:
 * max_bytes of host memory. mp: the ranks of a replica (P x T). */
static dt_status group_tests(const dt_launch_ctx *ctx, dt_comm *world, int mp, void *buf, long max_bytes) {
    dt_comm *const groups[2] = {ctx->tp_comm, ctx->dp_comm};
    static const char *const names[2] = {"tensor-parallel", "data-parallel"};
    const int rank = dt_comm_rank(world);
    for (int g = 0; g < 2; g++) {
        if (!groups[g]) continue;
        const size_t lengths[] = {0, 1, 1000003};
        for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) DT_TRY(check_allreduce(groups[g], lengths[i]));
        DT_TRY(check_parts(groups[g], 1000003));
        DT_TRY(check_broadcast_gather(groups[g]));
        DT_TRY(dt_comm_barrier(world)); /* every group's checks passed before rank 0 says so */
        if (rank == 0) {
            printf("group self-test: every %s group (%d ranks each): all-reduce, reduce-scatter, all-gather, broadcast, "
                   "barrier: ok\n", names[g], dt_comm_world(groups[g]));
            fflush(stdout);
        }
    }
    const int T = groups[0] ? dt_comm_world(groups[0]) : 1; /* rank 0's groups: ranks 0 .. T-1, and every mp-th */
    for (int g = 0; g < 2; g++) {
        if (!groups[g] || (g == 0 ? rank >= T : rank % mp != 0)) continue;
        if (rank == 0) printf("\nrank 0's %s group:", names[g]);
        DT_TRY(bandwidth_table(groups[g], T_ALLREDUCE, buf, max_bytes));
    }
    return DT_OK;
}

/* --pipeline-parallel, the collectives of two between neighbouring stages (ctx pp_prev, pp_next):
 * a send each way and an exchange (what 1F1B's steps are), checked; and the first and last
 * stages' all-reduce (the tied embedding's). Each rank tests its pair with the stage after first:
 * the last stage's pair finishes first and the chain unwinds toward the first. */
static dt_status check_pair(dt_comm *pair) {
    const int me = dt_comm_rank(pair);
    float x[3001], both[2 * 3001];
    for (int root = 0; root < 2; root++) {
        for (int i = 0; i < 3001; i++) x[i] = me == root ? test_value(root, (size_t)i) : 0.0f;
        DT_TRY(dt_comm_broadcast(pair, x, sizeof x, root));
        for (int i = 0; i < 3001; i++)
            if (x[i] != test_value(root, (size_t)i))
                return dt_error_set(DT_ERR_INTERNAL, "self-test failed: a send from stage rank %d of a pair: element %d "
                                    "differs", root, i);
    }
    for (int i = 0; i < 3001; i++) x[i] = test_value(2 + me, (size_t)i);
    DT_TRY(dt_comm_allgather(pair, x, sizeof x, both));
    for (int i = 0; i < 3001; i++)
        if (both[(1 - me) * 3001 + i] != test_value(3 - me, (size_t)i)) /* the other's, at its index */
            return dt_error_set(DT_ERR_INTERNAL, "self-test failed: an exchange between stages: element %d differs", i);
    return DT_OK;
}

static dt_status pair_tests(const dt_launch_ctx *ctx, dt_comm *world, int tp, void *buf, long max_bytes) {
    if (ctx->pp_next) DT_TRY(check_pair(ctx->pp_next));
    if (ctx->pp_prev) DT_TRY(check_pair(ctx->pp_prev));
    if (ctx->pp_ends) DT_TRY(check_allreduce(ctx->pp_ends, 1000003));
    DT_TRY(dt_comm_barrier(world)); /* every pair's checks passed before rank 0 says so */
    const int rank = dt_comm_rank(world);
    if (rank == 0) {
        printf("group self-test: every pair of neighbouring pipeline stages (a send each way, an exchange) and every "
               "pipeline's first and last stages (all-reduce): ok\n\nrank 0's pair of stages (rank 0 sends to rank "
               "%d):", tp);
        fflush(stdout);
    }
    /* rank 0 and the next stage's rank of its pipeline (comm_plan.h dt_mesh: rank tp) */
    dt_comm *pair = rank == 0 ? ctx->pp_next : rank == tp ? ctx->pp_prev : NULL;
    return pair ? bandwidth_table(pair, T_SEND, buf, max_bytes) : DT_OK;
}

/* Worker r: opens the backend on its device r (a device backend runs its probe kernel), then
 * the self-test and the table over the collective for that backend's buffers: on a device its
 * own (bootstrapped over the host collective; host buffers staged), the table on its memory. */
static dt_status doctor_worker(void *arg, dt_comm *c, const dt_launch_ctx *ctx) {
    const doctor_arg *a = arg;
    const int rank = dt_comm_rank(c);
    dt_backend *be = NULL;
    dt_comm *dev = NULL;
    void *buf = NULL;
    dt_backend_cfg bc = {.device = rank, .precision = 0, .rank = rank};
    dt_status st = dt_backend_open(a->kind, &bc, &be);
    if (st == DT_OK && be->ops->probe && (st = be->ops->probe(be->ctx)) == DT_OK) {
        dt_backend_desc d;
        be->ops->describe(be->ctx, &d);
        printf("  rank %d: %s: a kernel ran\n", rank, d.device);
        fflush(stdout);
    }
    if (st == DT_OK && ctx->plan->device_comm) st = be->ops->device_comm(be->ctx, c, a->timeout_s, &dev);
    /* the groups' collectives: on devices their own, bootstrapped over the host ones, made in the
     * order the trainer makes them (worker.c start_device_collective) */
    dt_launch_ctx g = *ctx;
    dt_comm **group[5] = {&g.tp_comm, &g.pp_prev, &g.pp_next, &g.pp_ends, &g.dp_comm}, *owned[5] = {NULL};
    for (int i = 0; st == DT_OK && ctx->plan->device_comm && i < 5; i++)
        if (*group[i] && (st = be->ops->device_comm(be->ctx, *group[i], a->timeout_s, &owned[i])) == DT_OK)
            *group[i] = owned[i];
    if (st == DT_OK) st = be->ops->alloc(be->ctx, (size_t)a->max_bytes, "the bandwidth buffer", &buf);
    if (st == DT_OK) st = be->ops->check(be->ctx);
    if (st == DT_OK) st = self_test(dev ? dev : c, buf, a->max_bytes);
    if (st == DT_OK && (g.tp_comm || g.dp_comm)) st = group_tests(&g, c, a->tp * a->pp, buf, a->max_bytes);
    if (st == DT_OK && (g.pp_next || g.pp_prev)) st = pair_tests(&g, c, a->tp, buf, a->max_bytes);
    if (be) be->ops->free(be->ctx, buf);
    for (int i = 0; st == DT_OK && i < 5; i++) dt_comm_free(owned[i]);
    if (st == DT_OK) dt_comm_free(dev); /* after a failure: left to the exit (destroy waits for peers) */
    dt_backend_close(be);
    return st;
}

/* Single-thread memcpy bandwidth over 64 MiB, best of 5 (GB/s, read + write counted once). */
static double memcpy_bandwidth(void) {
    size_t bytes = 64u << 20;
    char *a = malloc(bytes), *b = malloc(bytes);
    if (!a || !b) { free(a); free(b); return 0; }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 0;
    for (int k = 0; k < 5; k++) {
        double t0 = dt_clock_now();
        memcpy(b, a, bytes);
        double bw = (double)bytes / (dt_clock_now() - t0) / 1e9;
        if (bw > best) best = bw;
        a[k] = b[bytes - 1 - (size_t)k]; /* keep the copies observable */
    }
    free(a);
    free(b);
    return best;
}

void dt_doctor_print_versions(FILE *out) {
    int bad = dt_device_print_versions(out);
    bad += dt_backend_print_versions(out);
#ifdef DTRAIN_HAVE_MPI
    char mpi[512];
    bad += dt_mpi_version(mpi, sizeof mpi);
    fputs(mpi, out);
#else
    fprintf(out, "  MPI       mpi collective not built (no Open MPI development files at build time)\n");
#endif
    dt_device_print_version_verdict(out, bad);
}

dt_status dt_doctor_run(const dt_doctor_opts *o) {
    printf("dtrain doctor\n");
    printf("  CPUs usable: %d\n", dt_device_cpu_cores());
    dt_backend_print_devices(stdout);
    printf("  libraries:\n");
    dt_doctor_print_versions(stdout);
    char advice[512];
    if (dt_device_blas_advice(advice, sizeof advice)) printf("  %s\n", advice);
    const dt_device_kind kind = o->device;
    int workers = o->num_workers;
    if (kind != DT_DEVICE_CPU) {
        char who[64];
        snprintf(who, sizeof who, "doctor --device %s", dt_device_name(kind));
        DT_TRY(dt_backend_require(kind, who, "--device cpu"));
        const int n = dt_backend_count(kind);
        if (workers <= 0) workers = n; /* one worker per device */
        if (workers > n)
            return dt_error_set(DT_ERR_CONFIG, "%s: --num-workers %d but %d GPU(s) visible (hint: --num-workers %d)", who,
                                workers, n, n);
    } else {
        if (workers <= 0) workers = 2;
        printf("  memcpy bandwidth (one core, 64 MiB): %.2f GB/s\n", memcpy_bandwidth());
    }
    const int tp = o->tensor_parallel > 1 ? o->tensor_parallel : 1, pp = o->pipeline_parallel > 1 ? o->pipeline_parallel : 1;
    if (tp > 1 && workers % tp)
        return dt_error_set(DT_ERR_USAGE, "doctor --tensor-parallel %d: expected a divisor of --num-workers (%d)", tp,
                            workers);
    if (pp > 1 && workers % (tp * pp))
        return dt_error_set(DT_ERR_USAGE, "doctor --pipeline-parallel %d: expected a divisor of --num-workers (%d) / "
                            "--tensor-parallel (%d)", pp, workers, tp);
    const dt_ops *ops = dt_backend_ops(kind);
    dt_comm_plan_in in;
    dt_comm_plan plan;
    dt_launch_plan_in(DT_COMM_AUTO, NULL, NULL, workers, ops->name, ops->collective, &in);
    DT_TRY(dt_comm_plan_decide(&in, &plan));
    printf("collective self-test with %d worker process(es), backend %s\n", workers,
           plan.device_comm ? plan.device_comm : dt_hostcomm_name(plan.host));
    fflush(stdout);
    doctor_arg arg = {.max_bytes = o->max_bytes, .timeout_s = o->timeout_s, .kind = kind, .tp = tp, .pp = pp};
    const int dp = workers / (tp * pp);
    char shares[64] = "", pipes[64] = "";
    if (tp > 1) snprintf(shares, sizeof shares, "%d tensor-parallel group(s) of %d, ", workers / tp, tp);
    if (pp > 1) snprintf(pipes, sizeof pipes, ", %d pipeline(s) of %d stages", dp * tp, pp);
    if (tp * pp > 1)
        printf("model-parallel groups: %s%d data-parallel group(s) of %d%s\n", shares, dp > 1 ? tp * pp : 0, dp, pipes);
    dt_launch_cfg lc = {.world = workers, .plan = &plan, .timeout_s = o->timeout_s, .log_dir = NULL, .what = "doctor",
                        .tp = tp, .pp = pp};
    dt_status st = dt_launch_run(&lc, doctor_worker, &arg, NULL);
    if (st == DT_OK) printf("doctor: all checks passed\n");
    return st;
}
