/* comm_latency.c — how long a small collective takes between CPU workers on this host: W
 * forked workers on the shm collective run each of barrier, all-reduce of 1 and 256 floats,
 * reduce-scatter and all-gather of parts of 256 floats, and the per-step agreement's all-gather
 * of 40 bytes, in BATCHES batches of ITERS calls; rank 0 prints the median and the slowest batch
 * average per call (start to wait, through the communicator's thread, as training calls them).
 *   build/bench_comm_latency [WORKERS] [BATCHES] [ITERS]      (default: 2 20 200)
 * A benchmark, not a test: run it on a quiet machine (other processes on the cores show up as
 * slow batches, which is what the slowest column is for). */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include "dtrain/clock.h"
#include "dtrain/comm.h"

enum { BARRIER, AR1, AR256, RS256, AG256, GATHER40, N_OPS };
static const char *const names[N_OPS] = {"barrier", "all-reduce, 1 float", "all-reduce, 256 floats",
                                         "reduce-scatter, 256 floats", "all-gather of parts, 256 floats",
                                         "all-gather, 40 bytes a rank"};

static dt_status one(dt_comm *c, int op, float *buf, double *out) {
    switch (op) {
    case BARRIER: return dt_comm_barrier(c);
    case AR1: return dt_comm_allreduce(c, buf, 1, DT_REDUCE_SUM);
    case AR256: return dt_comm_allreduce(c, buf, 256, DT_REDUCE_SUM);
    case RS256: return dt_comm_reduce_scatter(c, buf, 256);
    case AG256: return dt_comm_allgather_parts(c, buf, 256);
    default: return dt_comm_allgather(c, buf, 40, out);
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int worker(dt_shm_world *w, int rank, int batches, int iters) {
    dt_comm *c;
    if (dt_comm_init_shm(&c, w, rank, 60) != DT_OK) return 1;
    static float buf[256];
    static double out[64 * 5];
    double *t = malloc((size_t)batches * sizeof *t);
    if (!t) return 1;
    if (rank == 0) printf("%-34s %12s %12s\n", "collective", "median (us)", "slowest (us)");
    for (int op = 0; op < N_OPS; op++) {
        for (int i = 0; i < 200; i++)
            if (one(c, op, buf, out) != DT_OK) return 1; /* warm-up */
        for (int b = 0; b < batches; b++) {
            if (dt_comm_barrier(c) != DT_OK) return 1;
            double t0 = dt_clock_now();
            for (int i = 0; i < iters; i++)
                if (one(c, op, buf, out) != DT_OK) return 1;
            t[b] = (dt_clock_now() - t0) / iters;
        }
        qsort(t, (size_t)batches, sizeof *t, cmp);
        if (rank == 0) printf("%-34s %12.1f %12.1f\n", names[op], t[batches / 2] * 1e6, t[batches - 1] * 1e6);
    }
    fflush(stdout);
    free(t);
    dt_comm_free(c);
    return 0;
}

int main(int argc, char **argv) {
    const int W = argc > 1 ? atoi(argv[1]) : 2, batches = argc > 2 ? atoi(argv[2]) : 20,
              iters = argc > 3 ? atoi(argv[3]) : 200;
    if (W < 2 || W > 64 || batches < 1 || iters < 1) {
        fprintf(stderr, "usage: bench_comm_latency [WORKERS 2..64] [BATCHES] [ITERS]\n");
        return 2;
    }
    dt_shm_world *w;
    if (dt_shm_world_create(&w, W, 0) != DT_OK) {
        fprintf(stderr, "bench_comm_latency: %s\n", dt_error_msg());
        return 1;
    }
    printf("%d workers, shm collective, %d batches of %d calls each\n", W, batches, iters);
    fflush(stdout);
    for (int r = 0; r < W; r++) {
        pid_t p = fork();
        if (p < 0) return 1;
        if (p == 0) _exit(worker(w, r, batches, iters));
    }
    int bad = 0;
    for (int r = 0; r < W; r++) {
        int status = 0;
        wait(&status);
        bad |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    }
    dt_shm_world_destroy(w);
    return bad;
}
