/* test_comm.c — the collectives of dt_comm over the shm backend, with real worker
 * processes: the shared world is made before fork, each child runs a scenario as one rank
 * and exits 0/1, the parent reaps them all (and kills them all on any failure, or when it
 * fails itself, so nothing is left behind).
 *
 *   test_comm           the full test, then a timing print (all-reduce busbw vs memcpy)
 *   test_comm --small   small sizes and no timing: for valgrind
 *   test_comm segments  only the argument checks and the named segments (external launchers)
 *   test_comm dead      those, then ranks that die while the others wait (external launchers) */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "dtrain/bf16.h"
#include "dtrain/comm.h"

static int g_small;            /* --small */
static int g_dies = -1;        /* the rank that kills itself (SIGKILL expected), reaped after all others */
static pid_t g_kids[64];       /* live children of the parent (0 = reaped) */
static int g_nkids;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void sleep_s(double s) {
    struct timespec t = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&t, &t) != 0) {}
}

static void kill_kids(void) {
    for (int i = 0; i < g_nkids; i++)
        if (g_kids[i] > 0) {
            kill(g_kids[i], SIGKILL);
            waitpid(g_kids[i], NULL, 0);
            g_kids[i] = 0;
        }
    g_nkids = 0;
}

/* A scenario runs in child `rank`; returns 0 on success (a failed CHECK exits 1). */
typedef int (*scenario_fn)(dt_shm_world *w, int rank, int world, void *arg);
/* Runs in the parent while the children run (may be NULL). */
typedef void (*parent_fn)(dt_shm_world *w, void *arg);

/* The tcp backend's runs: the ranks joined in a ring of socket pairs made before fork
 * (ring[r] connects rank r's "next" end with rank r+1's "prev" end). */
static int g_tcp, g_world, g_next_fd = -1, g_prev_fd = -1;
/* The hierarchical collective's runs: ranks 0-1 on "host" 0 and 2-3 on "host" 1, each host with
 * a shared world of its own, the two leaders (ranks 0 and 2) joined by socket pairs. */
static int g_hier;
static dt_shm_world *g_host_world[2];
static int g_leader_ring[2][2];
/* sums in another order than the serial one: within float rounding, not bit for bit */
static int approx(void) { return g_tcp || g_hier; }

static void run_world(const char *name, int world, size_t slot_bytes, scenario_fn fn, parent_fn pfn, void *arg) {
    dt_shm_world *w;
    CHECK(dt_shm_world_create(&w, world, slot_bytes) == DT_OK);
    int ring[64][2];
    for (int r = 0; g_tcp && r < world; r++) CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, ring[r]) == 0);
    fflush(stdout);
    fflush(stderr);
    pid_t parent = getpid();
    for (int r = 0; r < world; r++) {
        pid_t pid = fork();
        CHECK(pid >= 0);
        if (pid == 0) {
            g_nkids = 0; /* the siblings are not ours to kill */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != parent) _exit(1);
            if (g_hier) { /* only a leader's own ends of the leaders' ring: a dead leader's then close */
                for (int h = 0; h < 2; h++)
                    for (int e = 0; e < 2; e++)
                        if (r % 2 || !((h == r / 2 && e == 0) || (h != r / 2 && e == 1))) close(g_leader_ring[h][e]);
            }
            if (g_tcp) {
                int prev = (r + world - 1) % world;
                g_world = world;
                g_next_fd = ring[r][0];
                g_prev_fd = ring[prev][1];
                for (int k = 0; k < world; k++) {
                    if (k != r) close(ring[k][0]);
                    if (k != prev) close(ring[k][1]);
                }
            }
            int rc = fn(w, r, world, arg);
            fflush(stdout);
            fflush(stderr);
            _exit(rc == 0 ? 0 : 1);
        }
        g_kids[g_nkids++] = pid;
    }
    for (int r = 0; g_tcp && r < world; r++) {
        close(ring[r][0]);
        close(ring[r][1]);
    }
    for (int h = 0; g_hier && h < 2; h++) {
        close(g_leader_ring[h][0]);
        close(g_leader_ring[h][1]);
    }
    if (pfn) pfn(w, arg);
    double deadline = now_s() + (g_small ? 600 : 120);
    int left = world, failed = -1;
    while (left > 0) {
        for (int i = 0; i < g_nkids; i++) {
            if (g_kids[i] <= 0 || (i == g_dies && left > 1)) continue; /* a zombie until the others are done */
            int status;
            pid_t p = waitpid(g_kids[i], &status, WNOHANG);
            CHECK(p >= 0);
            if (p == 0) continue;
            g_kids[i] = 0;
            left--;
            if (i == g_dies && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) continue;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "%s (world %d): rank %d failed (%s %d)\n", name, world, i,
                        WIFEXITED(status) ? "exit status" : "signal",
                        WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
                if (failed < 0) failed = i;
            }
        }
        if (failed >= 0 || left == 0) break;
        if (now_s() > deadline) {
            fprintf(stderr, "%s (world %d): workers still running after the test's deadline\n", name, world);
            failed = world;
            break;
        }
        sleep_s(0.002);
    }
    kill_kids();
    dt_shm_world_destroy(w);
    CHECK(failed < 0);
    printf("%s%s, %d worker(s): ok\n", g_tcp ? "tcp: " : g_hier ? "hierarchical (2 hosts x 2): " : "", name, world);
}

static dt_status join_hier(int rank, double timeout_s, dt_comm **c) {
    dt_comm *local = NULL, *leaders = NULL;
    DT_TRY(dt_comm_init_shm(&local, g_host_world[rank / 2], rank % 2, timeout_s));
    if (rank % 2 == 0) {
        const int h = rank / 2;
        dt_status st = dt_comm_init_tcp(&leaders, h, 2, g_leader_ring[h][0], g_leader_ring[1 - h][1], timeout_s);
        if (st != DT_OK) {
            dt_comm_free(local);
            return st;
        }
        dt_comm_mark_remote(leaders);
    }
    return dt_comm_init_hier(c, local, leaders, rank, 4, timeout_s);
}

static dt_comm *join(dt_shm_world *w, int rank, double timeout_s) {
    dt_comm *c;
    dt_status st = g_hier  ? join_hier(rank, timeout_s, &c)
                   : g_tcp ? dt_comm_init_tcp(&c, rank, g_world, g_next_fd, g_prev_fd, timeout_s)
                           : dt_comm_init_shm(&c, w, rank, timeout_s);
    if (st != DT_OK) fprintf(stderr, "rank %d: %s\n", rank, dt_error_msg());
    CHECK(st == DT_OK);
    CHECK_INT_EQ(dt_comm_rank(c), rank);
    CHECK_STR_EQ(dt_comm_backend(c), g_hier ? "tcp+shm" : g_tcp ? "tcp" : "shm");
    return c;
}

/* Rank r's element i: every rank different, many mantissa bits, so that a different
 * summation order changes the rounding. */
static float val(int r, size_t i) {
    uint32_t h = (uint32_t)i * 2654435761u ^ ((uint32_t)r * 40503u + 0x9e3779b9u);
    h ^= h >> 15;
    h *= 0x2c1b3c6du;
    h ^= h >> 12;
    return ((float)h * (1.0f / 4294967296.0f) - 0.5f) * (1.0f + 0.37f * (float)r);
}

/* The serial reference: ranks summed in order 0..N-1, then times 1/N for AVG. */
static float expect_val(int world, size_t i, dt_reduce_op op) {
    float s = val(0, i);
    for (int r = 1; r < world; r++) s += val(r, i);
    return op == DT_REDUCE_AVG ? s * (1.0f / (float)world) : s;
}

static uint64_t fnv1a(const void *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

static void check_result(const float *buf, size_t n, int world, dt_reduce_op op, int rank, const char *what) {
    for (size_t i = 0; i < n; i++) {
        float e = expect_val(world, i, op);
        /* shm sums in rank order (bit-exact); the ring in its own order (float rounding) */
        int bad = approx() ? !(fabsf(buf[i] - e) <= 1e-6f * (fabsf(e) + 1.0f)) : memcmp(&buf[i], &e, sizeof e) != 0;
        if (bad) {
            fprintf(stderr, "rank %d: %s: %s of %zu floats, element %zu: got %.9g, expected %.9g\n", rank, what,
                    op == DT_REDUCE_SUM ? "sum" : "avg", n, i, buf[i], e);
            CHECK(0);
        }
    }
}

/* Every rank holds the same bits of buf(n): the checksums all-gathered and compared. */
static void check_same_everywhere(dt_comm *c, const float *buf, size_t n, int world) {
    uint64_t mine = fnv1a(buf, n * sizeof(float)), all[64];
    CHECK_OK(dt_comm_allgather(c, &mine, sizeof mine, all));
    for (int r = 0; r < world; r++) CHECK(all[r] == mine);
}

/* ---- scenarios ---- */

typedef struct {
    size_t lens[8];
    int nlens;
} ar_args;

/* SUM and AVG over every length; exact against the serial sum; the same bits on every
 * rank (the checksums are all-gathered and compared). */
static int sc_allreduce(dt_shm_world *w, int rank, int world, void *arg) {
    const ar_args *a = arg;
    dt_comm *c = join(w, rank, 30);
    CHECK_INT_EQ(dt_comm_world(c), world);
    for (int li = 0; li < a->nlens; li++) {
        size_t n = a->lens[li];
        for (int opi = 0; opi < 2; opi++) {
            dt_reduce_op op = opi ? DT_REDUCE_AVG : DT_REDUCE_SUM;
            float *buf = malloc((n ? n : 1) * sizeof(float));
            CHECK(buf);
            for (size_t i = 0; i < n; i++) buf[i] = val(rank, i);
            CHECK_OK(dt_comm_allreduce(c, n ? buf : NULL, n, op));
            check_result(buf, n, world, op, rank, "all-reduce");
            check_same_everywhere(c, buf, n, world);
            free(buf);
        }
    }
    dt_comm_free(c);
    return 0;
}

/* Buckets: several all-reduce_start, a blocking broadcast in between, waits in order; then
 * one more start that is never waited for (dt_comm_free must finish and release it). */
static int sc_async(dt_shm_world *w, int rank, int world, void *arg) {
    (void)arg;
    dt_comm *c = join(w, rank, 30);
    enum { NB = 5 };
    const size_t lens[NB] = {1000, 1, 70000, 0, 5};
    const dt_reduce_op ops[NB] = {DT_REDUCE_SUM, DT_REDUCE_AVG, DT_REDUCE_SUM, DT_REDUCE_SUM, DT_REDUCE_AVG};
    float *b[NB];
    dt_comm_req *req[NB];
    for (int k = 0; k < NB; k++) {
        b[k] = malloc((lens[k] + 1) * sizeof(float));
        CHECK(b[k]);
        for (size_t i = 0; i < lens[k]; i++) b[k][i] = val(rank, i);
    }
    unsigned char bc[10000];
    for (size_t i = 0; i < sizeof bc; i++) bc[i] = (unsigned char)(rank == world - 1 ? i * 7 + 3 : 0);
    CHECK_OK(dt_comm_allreduce_start(c, b[0], lens[0], ops[0], DT_WIRE_F32, &req[0]));
    CHECK_OK(dt_comm_allreduce_start(c, b[1], lens[1], ops[1], DT_WIRE_F32, &req[1]));
    CHECK_OK(dt_comm_broadcast(c, bc, sizeof bc, world - 1)); /* queued behind buckets 0 and 1 */
    for (int k = 2; k < NB; k++) CHECK_OK(dt_comm_allreduce_start(c, b[k], lens[k], ops[k], DT_WIRE_F32, &req[k]));
    for (int k = 0; k < NB; k++) {
        CHECK_OK(dt_comm_wait(c, req[k]));
        check_result(b[k], lens[k], world, ops[k], rank, "bucket");
        free(b[k]);
    }
    for (size_t i = 0; i < sizeof bc; i++) CHECK_INT_EQ(bc[i], (unsigned char)(i * 7 + 3));
    float last[300];
    dt_comm_req *never_waited;
    CHECK_OK(dt_comm_allreduce_start(c, last, 300, DT_REDUCE_SUM, DT_WIRE_F32, &never_waited));
    dt_comm_free(c);
    return 0;
}

/* What rank q leaves in its part before an all-gather of parts (distinct from val). */
static float part_val(int q, size_t i) { return (float)q * 1000.0f + (float)(i % 997) * 0.25f; }

/* Reduce-scatter then all-gather of parts (ZeRO-1's pair) over every length, blocking and
 * started together: after the reduce-scatter this rank's part (dt_comm_part) holds the serial
 * sum (shm: its exact bits, the all-reduce's order); the all-gather gives every rank every
 * owner's part, whatever the other parts held before; the bytes counted are (N-1)/N of the
 * buffer each. */
static int sc_parts(dt_shm_world *w, int rank, int world, void *arg) {
    const ar_args *a = arg;
    dt_comm *c = join(w, rank, 30);
    for (int li = 0; li < a->nlens; li++) {
        const size_t n = a->lens[li];
        float *buf = malloc((n ? n : 1) * sizeof(float)), *two = malloc((n ? n : 1) * sizeof(float));
        CHECK(buf && two);
        for (size_t i = 0; i < n; i++) buf[i] = two[i] = val(rank, i);
        const uint64_t sent0 = dt_comm_bytes_sent(c);
        CHECK_OK(dt_comm_reduce_scatter(c, n ? buf : NULL, n));
        if (!g_hier) CHECK(dt_comm_bytes_sent(c) - sent0 == (uint64_t)(world - 1) * n * sizeof(float) / (uint64_t)world);
        size_t lo, hi;
        dt_comm_part(n, world, rank, &lo, &hi);
        CHECK(hi - lo <= n / (size_t)world + 1);
        for (size_t i = lo; i < hi; i++) {
            float e = expect_val(world, i, DT_REDUCE_SUM);
            int bad = approx() ? !(fabsf(buf[i] - e) <= 1e-6f * (fabsf(e) + 1.0f)) : memcmp(&buf[i], &e, sizeof e) != 0;
            if (bad) fprintf(stderr, "rank %d: reduce-scatter of %zu: element %zu got %.9g, expected %.9g\n", rank, n, i,
                             buf[i], e);
            CHECK(!bad);
        }
        for (size_t i = 0; i < n; i++) buf[i] = i >= lo && i < hi ? part_val(rank, i) : NAN;
        CHECK_OK(dt_comm_allgather_parts(c, n ? buf : NULL, n));
        for (int q = 0; q < world; q++) {
            size_t qlo, qhi;
            dt_comm_part(n, world, q, &qlo, &qhi);
            for (size_t i = qlo; i < qhi; i++) {
                if (buf[i] != part_val(q, i))
                    fprintf(stderr, "rank %d: all-gather of parts of %zu: element %zu (rank %d's) got %.9g\n", rank, n,
                            i, q, buf[i]);
                CHECK(buf[i] == part_val(q, i));
            }
        }
        /* started together, as buckets are: two reduce-scatters, then both all-gathers */
        dt_comm_req *r1, *r2;
        for (size_t i = 0; i < n; i++) buf[i] = val(rank, i);
        CHECK_OK(dt_comm_reduce_scatter_start(c, n ? buf : NULL, n, DT_WIRE_F32, &r1));
        CHECK_OK(dt_comm_reduce_scatter_start(c, n ? two : NULL, n, DT_WIRE_F32, &r2));
        CHECK_OK(dt_comm_wait(c, r1));
        CHECK_OK(dt_comm_wait(c, r2));
        CHECK(memcmp(buf + lo, two + lo, (hi - lo) * sizeof(float)) == 0);
        CHECK_OK(dt_comm_allgather_parts_start(c, n ? buf : NULL, n, &r1));
        CHECK_OK(dt_comm_allgather_parts_start(c, n ? two : NULL, n, &r2));
        CHECK_OK(dt_comm_wait(c, r1));
        CHECK_OK(dt_comm_wait(c, r2));
        CHECK(fnv1a(buf, n * sizeof(float)) == fnv1a(two, n * sizeof(float)));
        check_same_everywhere(c, buf, n, world);
        free(buf);
        free(two);
    }
    dt_comm_free(c);
    return 0;
}

/* DT_WIRE_BF16: an all-reduce (sum and avg) and a reduce-scatter with the values travelling
 * as bf16. shm: exactly the sum in rank order of each rank's values rounded to bf16 (the
 * all-reduce's result rounded again); the ring rounds its partial sums too: within bf16's
 * precision of that. Every rank the same bits after the all-reduce; half the bytes counted. */
static int sc_bf16(dt_shm_world *w, int rank, int world, void *arg) {
    const ar_args *a = arg;
    dt_comm *c = join(w, rank, 30);
    for (int li = 0; li < a->nlens; li++) {
        const size_t n = a->lens[li];
        float *buf = malloc((n ? n : 1) * sizeof(float));
        CHECK(buf);
        for (int kind = 0; kind < 3; kind++) { /* all-reduce sum, all-reduce avg, reduce-scatter */
            for (size_t i = 0; i < n; i++) buf[i] = val(rank, i);
            const uint64_t sent0 = dt_comm_bytes_sent(c);
            dt_comm_req *req;
            if (kind < 2)
                CHECK_OK(dt_comm_allreduce_start(c, n ? buf : NULL, n, kind ? DT_REDUCE_AVG : DT_REDUCE_SUM,
                                                 DT_WIRE_BF16, &req));
            else
                CHECK_OK(dt_comm_reduce_scatter_start(c, n ? buf : NULL, n, DT_WIRE_BF16, &req));
            CHECK_OK(dt_comm_wait(c, req));
            const uint64_t f32 = (kind < 2 ? 2 : 1) * (uint64_t)(world - 1) * n * sizeof(float) / (uint64_t)world;
            if (!g_hier) {
                CHECK(dt_comm_bytes_sent(c) - sent0 == (kind < 2 ? 2 : 1) * (uint64_t)(world - 1) * n * 2 / (uint64_t)world);
                CHECK(world == 1 || n < (size_t)world || dt_comm_bytes_sent(c) - sent0 < f32);
            }
            size_t lo = 0, hi = n;
            if (kind == 2) dt_comm_part(n, world, rank, &lo, &hi);
            for (size_t i = lo; i < hi; i++) {
                float e = 0.0f;
                for (int r = 0; r < world; r++) e += dt_bf16_round(val(r, i));
                if (kind == 1) e *= 1.0f / (float)world;
                if (kind < 2) e = dt_bf16_round(e);
                /* the ring: each of its N-1 hops rounds a partial sum (2^-9 relative each) */
                const float tol = 4e-3f * (float)world * (fabsf(e) + 1.0f);
                int bad = approx() ? !(fabsf(buf[i] - e) <= tol) : memcmp(&buf[i], &e, sizeof e) != 0;
                if (bad) fprintf(stderr, "rank %d: bf16 %s of %zu, element %zu: got %.9g, expected %.9g\n", rank,
                                 kind == 0 ? "sum" : kind == 1 ? "avg" : "reduce-scatter", n, i, buf[i], e);
                CHECK(!bad);
            }
            if (kind < 2) check_same_everywhere(c, buf, n, world);
        }
        /* a sum of bf16 values (tensor parallelism's bf16 activations): without a bf16 sum of
         * its own the backend sums them as floats (the bytes counted as floats), rounded once */
        uint16_t *b16 = malloc((n ? n : 1) * sizeof *b16);
        CHECK(b16);
        for (size_t i = 0; i < n; i++) b16[i] = dt_float_to_bf16(val(rank, i));
        const uint64_t sent0 = dt_comm_bytes_sent(c);
        CHECK_OK(dt_comm_allreduce_bf16(c, n ? b16 : NULL, n));
        if (!g_hier) CHECK(dt_comm_bytes_sent(c) - sent0 == 2 * (uint64_t)(world - 1) * n * sizeof(float) / (uint64_t)world);
        for (size_t i = 0; i < n; i++) {
            float e = 0.0f;
            for (int r = 0; r < world; r++) e += dt_bf16_round(val(r, i));
            const float got = dt_bf16_to_float(b16[i]), want = dt_bf16_round(e);
            const float tol = 4e-3f * (float)world * (fabsf(want) + 1.0f);
            const int bad = approx() ? !(fabsf(got - want) <= tol) : got != want;
            if (bad) fprintf(stderr, "rank %d: bf16 values' sum of %zu, element %zu: got %.9g, expected %.9g\n", rank, n,
                             i, got, want);
            CHECK(!bad);
        }
        free(b16);
        free(buf);
    }
    dt_comm_free(c);
    return 0;
}

/* A reduce-scatter that rank `world - 1` never joins fails at the deadline, naming it (shm: the
 * rank; tcp: the neighbour the ring waited for). */
static int sc_parts_timeout(dt_shm_world *w, int rank, int world, void *arg) {
    (void)arg;
    dt_comm *c = join(w, rank, 0.5);
    if (rank == world - 1) {
        sleep_s(g_small ? 6 : 1.5);
        dt_comm_free(c);
        return 0;
    }
    float buf[1000] = {0};
    dt_status st = dt_comm_reduce_scatter(c, buf, 1000);
    CHECK_INT_EQ(st, DT_ERR_DEVICE);
    if (!g_small) printf("  rank %d: %s\n", rank, dt_error_msg());
    if (g_tcp) {
        if (rank == 0) CHECK_STR_CONTAINS(dt_error_msg(), "reduce-scatter #1 on rank 0 waited 0.5 s for rank ");
    } else {
        CHECK_STR_CONTAINS(dt_error_msg(), "reduce-scatter #1 (1000 floats)");
        if (strstr(dt_error_msg(), "collective timeout")) CHECK_STR_CONTAINS(dt_error_msg(), "for rank(s) 2 ");
    }
    dt_comm_free(c);
    return 0;
}

/* Broadcast from a non-zero root (chunked through small slots), all-gather, barrier. */
static int sc_bcast_gather_barrier(dt_shm_world *w, int rank, int world, void *arg) {
    _Atomic int *counter = arg; /* a MAP_SHARED page of the parent */
    dt_comm *c = join(w, rank, 30);
    int root = world - 1;
    unsigned char big[5000], small[3];
    for (size_t i = 0; i < sizeof big; i++) big[i] = (unsigned char)(rank == root ? i * 13 + 1 : 0xee);
    for (size_t i = 0; i < sizeof small; i++) small[i] = (unsigned char)(rank == 1 % world ? 40 + i : 0);
    CHECK_OK(dt_comm_broadcast(c, big, sizeof big, root));
    CHECK_OK(dt_comm_broadcast(c, small, sizeof small, 1 % world));
    CHECK_OK(dt_comm_broadcast(c, NULL, 0, 0));
    for (size_t i = 0; i < sizeof big; i++) CHECK_INT_EQ(big[i], (unsigned char)(i * 13 + 1));
    for (size_t i = 0; i < sizeof small; i++) CHECK_INT_EQ(small[i], 40 + i);

    enum { PER = 301 };
    unsigned char in[PER], out[64 * PER];
    for (int i = 0; i < PER; i++) in[i] = (unsigned char)(rank * 31 + i);
    CHECK_OK(dt_comm_allgather(c, in, PER, out));
    for (int r = 0; r < world; r++)
        for (int i = 0; i < PER; i++) CHECK_INT_EQ(out[r * PER + i], (unsigned char)(r * 31 + i));
    CHECK_OK(dt_comm_allgather(c, in, 0, out));

    /* after barrier k every rank has counted k+1 times */
    for (int k = 0; k < 40; k++) {
        atomic_fetch_add(counter, 1);
        CHECK_OK(dt_comm_barrier(c));
        CHECK(atomic_load(counter) >= (k + 1) * world);
        if (rank == k % world) sleep_s(0.001); /* a different straggler each time */
    }
    dt_comm_free(c);
    return 0;
}

/* Rank 2 never calls the all-reduce; ranks 0 and 1 fail after ~0.5 s naming it. Rank 2,
 * coming late, finds the world aborted. */
static int sc_timeout(dt_shm_world *w, int rank, int world, void *arg) {
    (void)arg;
    (void)world;
    dt_comm *c = join(w, rank, 0.5);
    if (rank == 2) {
        sleep_s(g_small ? 6 : 1.5);
        double t0 = now_s();
        dt_status st = dt_comm_barrier(c);
        CHECK_INT_EQ(st, DT_ERR_DEVICE);
        CHECK(now_s() - t0 < 0.5);
        CHECK_STR_CONTAINS(dt_error_msg(), "collective aborted: ");
        CHECK_STR_CONTAINS(dt_error_msg(), "rank(s) 2 ");
        dt_comm_free(c);
        return 0;
    }
    float buf[4096] = {0};
    double t0 = now_s();
    dt_status st = dt_comm_allreduce(c, buf, 4096, DT_REDUCE_SUM);
    double dt = now_s() - t0;
    CHECK_INT_EQ(st, DT_ERR_DEVICE);
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", dt_error_msg());
    if (!g_small) printf("  rank %d after %.2f s: %s\n", rank, dt, msg);
    CHECK(dt >= 0.3 && dt < (g_small ? 5.0 : 1.5));
    CHECK_STR_CONTAINS(msg, "all-reduce #1 (4096 floats)");
    CHECK_STR_CONTAINS(msg, "waited 0.5 s for rank(s) 2 ");
    CHECK_STR_CONTAINS(msg, "training.collective_timeout_s");
    /* broken: the next call fails at once with the same message */
    t0 = now_s();
    CHECK_INT_EQ(dt_comm_barrier(c), DT_ERR_DEVICE);
    CHECK(now_s() - t0 < 0.1);
    CHECK_STR_EQ(dt_error_msg(), msg);
    dt_comm_req *r = (dt_comm_req *)1;
    CHECK_INT_EQ(dt_comm_allreduce_start(c, buf, 10, DT_REDUCE_SUM, DT_WIRE_F32, &r), DT_ERR_DEVICE);
    CHECK(r == NULL);
    CHECK_INT_EQ(dt_comm_wait(c, r), DT_ERR_DEVICE);
    CHECK_STR_EQ(dt_error_msg(), msg);
    dt_comm_free(c);
    return 0;
}

/* Ranks 0..2 of 4 wait in a barrier that cannot complete (rank 3 never comes); the
 * parent, as the supervisor would, aborts the world. */
static int sc_abort(dt_shm_world *w, int rank, int world, void *arg) {
    (void)arg;
    dt_comm *c = join(w, rank, 60);
    if (rank == world - 1) { /* never joins the barrier */
        dt_comm_free(c);
        return 0;
    }
    double t0 = now_s();
    CHECK_INT_EQ(dt_comm_barrier(c), DT_ERR_DEVICE);
    double dt = now_s() - t0;
    CHECK(dt < (g_small ? 20.0 : 2.0)); /* the parent aborts after 0.3 s */
    CHECK_STR_CONTAINS(dt_error_msg(), "collective aborted: worker 7 died (test)");
    CHECK_STR_CONTAINS(dt_error_msg(), "barrier #1");
    CHECK_INT_EQ(dt_comm_allreduce(c, NULL, 0, DT_REDUCE_SUM), DT_ERR_DEVICE);
    dt_comm_free(c);
    return 0;
}

static void parent_abort(dt_shm_world *w, void *arg) {
    (void)arg;
    sleep_s(g_small ? 3 : 0.3);
    dt_shm_world_abort(w, "worker 7 died (test)");
}

/* DTRAIN_TEST_BREAK_ALLREDUCE=1: rank 1's element 0 is off by exactly 1.0, nothing else. */
static int sc_break(dt_shm_world *w, int rank, int world, void *arg) {
    (void)arg;
    dt_comm *c = join(w, rank, 30);
    enum { N = 100 };
    float buf[N], want[N];
    for (int i = 0; i < N; i++) {
        buf[i] = (float)(rank * 1000 + i); /* integers: the +1.0 is exact */
        want[i] = 0;
        for (int r = 0; r < world; r++) want[i] += (float)(r * 1000 + i);
    }
    CHECK_OK(dt_comm_allreduce(c, buf, N, DT_REDUCE_SUM));
    CHECK(buf[0] - want[0] == (rank == 1 ? 1.0f : 0.0f));
    for (int i = 1; i < N; i++) CHECK(buf[i] == want[i]);
    dt_comm_free(c);
    return 0;
}

/* Rank 0 all-reduces while rank 1 broadcasts: both fail with a message naming both (shm
 * checks the published op descriptions, tcp the op headers passed around the ring). */
static int sc_mismatch(dt_shm_world *w, int rank, int world, void *arg) {
    (void)arg;
    (void)world;
    dt_comm *c = join(w, rank, 30);
    float buf[10] = {0};
    dt_status st = rank == 0 ? dt_comm_allreduce(c, buf, 10, DT_REDUCE_SUM) : dt_comm_broadcast(c, buf, 40, 0);
    CHECK(st != DT_OK);
    CHECK_STR_CONTAINS(dt_error_msg(), "collective mismatch: ");
    if (g_tcp) {
        CHECK_STR_CONTAINS(dt_error_msg(), rank == 0 ? "issued all-reduce #1 of 10 items, rank 1 issued broadcast #1 of 40"
                                                     : "issued broadcast #1 of 40 items, rank 0 issued all-reduce #1 of 10");
    } else {
        CHECK_STR_CONTAINS(dt_error_msg(), "all-reduce #1 (10 floats)");
        CHECK_STR_CONTAINS(dt_error_msg(), "broadcast #1 (40 bytes from rank 0)");
    }
    dt_comm_free(c);
    return 0;
}

/* One rank sends its gradients as bf16, the other as float32 (configs that differ in
 * training.grad_comm_dtype): caught as a mismatch, not summed as garbage. */
static int sc_wire_mismatch(dt_shm_world *w, int rank, int world, void *arg) {
    (void)arg;
    (void)world;
    dt_comm *c = join(w, rank, 30);
    float buf[10] = {0};
    dt_comm_req *req;
    CHECK_OK(dt_comm_allreduce_start(c, buf, 10, DT_REDUCE_SUM, rank ? DT_WIRE_BF16 : DT_WIRE_F32, &req));
    CHECK(dt_comm_wait(c, req) != DT_OK);
    CHECK_STR_CONTAINS(dt_error_msg(), "collective mismatch: ");
    if (g_tcp) CHECK_STR_CONTAINS(dt_error_msg(), rank == 0 ? "rank 1 issued all-reduce (bf16) #1" : "issued all-reduce (bf16) #1");
    else CHECK_STR_CONTAINS(dt_error_msg(), "all-reduce #1 (10 floats, as bf16)");
    dt_comm_free(c);
    return 0;
}

/* tcp: rank 1 never calls the all-reduce; rank 0 fails at its deadline naming the neighbour */
static int sc_timeout_tcp(dt_shm_world *w, int rank, int world, void *arg) {
    (void)arg;
    (void)world;
    dt_comm *c = join(w, rank, 0.5);
    if (rank == 0) {
        float buf[4] = {0};
        dt_status st = dt_comm_allreduce(c, buf, 4, DT_REDUCE_SUM);
        CHECK(st == DT_ERR_DEVICE);
        CHECK_STR_CONTAINS(dt_error_msg(), "collective timeout: all-reduce #1 on rank 0 waited 0.5 s for rank 1");
    } else {
        sleep_s(1.5); /* then goes away: its connections close */
    }
    dt_comm_free(c);
    return 0;
}

/* Hierarchical: only the leaders send between hosts, an all-reduce of B bytes over 2 leaders
 * 2(2-1)/2 x B each; the other ranks nothing (their bytes stay in their host's memory). */
static int sc_hier_bytes(dt_shm_world *w, int rank, int world, void *arg) {
    (void)arg;
    (void)world;
    dt_comm *c = join(w, rank, 30);
    enum { N = 100000 };
    static float buf[N];
    const uint64_t r0 = dt_comm_bytes_remote(c);
    CHECK_OK(dt_comm_allreduce(c, buf, N, DT_REDUCE_SUM));
    const uint64_t remote = dt_comm_bytes_remote(c) - r0;
    CHECK(remote == (rank % 2 == 0 ? (uint64_t)N * sizeof(float) : 0));
    dt_comm_free(c);
    return 0;
}

/* A scenario over the hierarchical collective: 4 ranks on two "hosts" of 2 (fresh shared
 * worlds and leader socket pairs for each run). */
static void run_hier(const char *name, scenario_fn fn, void *arg) {
    for (int h = 0; h < 2; h++) {
        CHECK(dt_shm_world_create(&g_host_world[h], 2, 0) == DT_OK);
        CHECK(socketpair(AF_UNIX, SOCK_STREAM, 0, g_leader_ring[h]) == 0);
    }
    g_hier = 1;
    run_world(name, 4, 0, fn, NULL, arg);
    g_hier = 0;
    for (int h = 0; h < 2; h++) dt_shm_world_destroy(g_host_world[h]); /* the ring's ends: closed by run_world */
}

/* ---- single process: argument checks ---- */

static void test_arguments(void) {
    dt_shm_world *w;
    CHECK(dt_shm_world_create(&w, 0, 0) != DT_OK);
    CHECK(dt_shm_world_create(&w, 65, 0) != DT_OK);
    CHECK_STR_CONTAINS(dt_error_msg(), "training.num_workers");
    CHECK_OK(dt_shm_world_create(&w, 1, 0));
    dt_comm *c;
    CHECK(dt_comm_init_shm(&c, w, 1, 5) != DT_OK);
    CHECK(c == NULL);
    CHECK_INT_EQ(dt_comm_init_shm(&c, w, 0, 0), DT_ERR_CONFIG);
    CHECK_STR_CONTAINS(dt_error_msg(), "training.collective_timeout_s");
    dt_comm_free(NULL);

    /* world 1: trivial but correct */
    c = join(w, 0, 5);
    float x[3] = {1.5f, -2, 3};
    CHECK_OK(dt_comm_allreduce(c, x, 3, DT_REDUCE_AVG));
    CHECK(x[0] == 1.5f && x[1] == -2 && x[2] == 3);
    int g[1] = {42}, out[1] = {0};
    CHECK_OK(dt_comm_allgather(c, g, sizeof g, out));
    CHECK_INT_EQ(out[0], 42);
    CHECK_OK(dt_comm_broadcast(c, g, sizeof g, 0));
    CHECK_OK(dt_comm_barrier(c));
    /* a bad argument fails and breaks the communicator */
    CHECK_INT_EQ(dt_comm_broadcast(c, g, sizeof g, 3), DT_ERR_INTERNAL);
    CHECK_STR_CONTAINS(dt_error_msg(), "broadcast root 3");
    dt_error_clear();
    CHECK_INT_EQ(dt_comm_barrier(c), DT_ERR_INTERNAL);
    CHECK_STR_CONTAINS(dt_error_msg(), "broadcast root 3");
    dt_comm_free(c);
    dt_shm_world_destroy(w);
    printf("arguments and world 1: ok\n");
}

/* Every rank says its pid (dt_shm_world_join, as the ranks of an external launcher do) with a
 * rank in the job of its own (rank + 10 on shm: the messages name that one); rank *arg then
 * dies (SIGKILL; the parent reaps it only after the others: a zombie meanwhile, as under a
 * launcher slow to reap). The others, in an all-reduce with a 60 s deadline, fail within a few
 * seconds; those on the dead rank's host name it. */
static int sc_dead(dt_shm_world *w, int rank, int world, void *arg) {
    (void)world;
    const int victim = *(const int *)arg, grank = g_hier ? rank : rank + 10;
    dt_shm_world_join(g_hier ? g_host_world[rank / 2] : w, g_hier ? rank % 2 : rank, grank);
    dt_comm *c = join(w, rank, 60);
    CHECK_OK(dt_comm_barrier(c)); /* every pid is out */
    if (rank == victim) raise(SIGKILL);
    float buf[64] = {0};
    double t0 = now_s();
    dt_status st = dt_comm_allreduce(c, buf, 64, DT_REDUCE_SUM);
    double dt = now_s() - t0;
    CHECK(st != DT_OK);
    char msg[2048], want[64];
    snprintf(msg, sizeof msg, "%s", dt_error_msg());
    printf("  rank %d failed after %.2f s: %s\n", rank, dt, msg);
    CHECK(dt < (g_small ? 30.0 : 10.0)); /* the deadline is 60 s */
    snprintf(want, sizeof want, "rank %d (pid ", g_hier ? victim : victim + 10);
    if (!g_hier || rank / 2 == victim / 2) {
        CHECK_STR_CONTAINS(msg, want);
        CHECK_STR_CONTAINS(msg, "exited or was killed while rank ");
    }
    dt_comm_free(c);
    return 0;
}

static void test_dead_ranks(void) {
    int victim = 1;
    g_dies = victim;
    run_world("a rank killed while the others wait", 3, 0, sc_dead, NULL, &victim);
    for (victim = 2; victim <= 3; victim++) { /* a leader, then the other rank of its host */
        g_dies = victim;
        run_hier(victim == 2 ? "a leader killed while the others wait" : "a leader's host peer killed", sc_dead, &victim);
    }
    g_dies = -1;
}

/* ---- a world in a named segment, as the rendezvous makes one (external launchers) ---- */

/* a fresh segment /NAME (tagged with our pid) of `mode`, holding a world of `world` ranks with
 * 4 KiB slots; its fd (the creator's world in *w) */
static int make_segment(char *name, size_t n, const char *tag, mode_t mode, int world, dt_shm_world **w) {
    snprintf(name, n, "/dtrain-test-%ld-%s", (long)getpid(), tag);
    shm_unlink(name);
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    CHECK(fd >= 0);
    CHECK(fchmod(fd, mode) == 0);
    CHECK_OK(dt_shm_world_create_fd(w, world, 4096, fd));
    return fd;
}

/* A segment that group or others may write, or another user's, is refused naming it; ours
 * (0600) is mapped. */
static void test_segment_owner_mode(void) {
    char name[96];
    dt_shm_world *w = NULL, *a = (dt_shm_world *)1;
    int fd = make_segment(name, sizeof name, "mode", 0644, 2, &w);
    int fd2 = shm_open(name, O_RDWR, 0);
    CHECK(fd2 >= 0);
    CHECK_INT_EQ(dt_shm_world_attach_fd(&a, 2, fd2, name), DT_ERR_USAGE);
    CHECK(a == NULL);
    printf("  %s\n", dt_error_msg());
    CHECK_STR_CONTAINS(dt_error_msg(), name);
    CHECK_STR_CONTAINS(dt_error_msg(), "with mode 0644, expected a file of this user (uid ");
    CHECK(fchmod(fd, 0600) == 0);
    if (geteuid() == 0) { /* root can give it away */
        CHECK(fchown(fd, 65534, (gid_t)-1) == 0);
        CHECK_INT_EQ(dt_shm_world_attach_fd(&a, 2, fd2, name), DT_ERR_USAGE);
        printf("  %s\n", dt_error_msg());
        CHECK_STR_CONTAINS(dt_error_msg(), "owned by uid 65534");
        CHECK_STR_CONTAINS(dt_error_msg(), name);
        CHECK(fchown(fd, geteuid(), (gid_t)-1) == 0);
    }
    CHECK_OK(dt_shm_world_attach_fd(&a, 2, fd2, name));
    dt_shm_world_destroy(a);
    dt_shm_world_destroy(w);
    close(fd2);
    close(fd);
    CHECK(shm_unlink(name) == 0);
    printf("a segment of another user, or one others may write: refused: ok\n");
}

static int g_seg_fd = -1;

/* Each rank maps the segment itself; then rank 0 scribbles over the sizes at the start of the
 * shared block (as a buggy or hostile process of this user could): every rank keeps using the
 * sizes it checked when it attached, and the all-reduce still adds up. */
static int sc_scribble(dt_shm_world *unused, int rank, int world, void *arg) {
    (void)unused, (void)arg;
    dt_shm_world *w;
    CHECK_OK(dt_shm_world_attach_fd(&w, world, g_seg_fd, "/the-segment"));
    dt_comm *c = join(w, rank, 30);
    CHECK_OK(dt_comm_barrier(c));
    if (rank == 0) {
        size_t *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, g_seg_fd, 0);
        CHECK(p != MAP_FAILED);
        p[0] = p[1] = p[2] = (size_t)1 << 45; /* map_bytes, slot_bytes, data_offset as they were laid out */
        munmap(p, 4096);
    }
    CHECK_OK(dt_comm_barrier(c));
    enum { N = 3000 };
    float buf[N];
    for (size_t i = 0; i < N; i++) buf[i] = val(rank, i);
    CHECK_OK(dt_comm_allreduce(c, buf, N, DT_REDUCE_SUM));
    check_result(buf, N, world, DT_REDUCE_SUM, rank, "after the scribble");
    dt_comm_free(c);
    dt_shm_world_destroy(w);
    return 0;
}

static void test_segment_scribble(void) {
    char name[96];
    dt_shm_world *w;
    g_seg_fd = make_segment(name, sizeof name, "scribble", 0600, 3, &w);
    run_world("the shared header scribbled over after attach", 3, 0, sc_scribble, NULL, NULL);
    dt_shm_world_destroy(w);
    close(g_seg_fd);
    g_seg_fd = -1;
    CHECK(shm_unlink(name) == 0);
}

/* ---- /dev/shm before and after ---- */

static int list_dev_shm(char names[][256], int cap) {
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < cap)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) snprintf(names[n++], 256, "%s", e->d_name);
    closedir(d);
    return n;
}

/* ---- timing print (not an assertion) ---- */

typedef struct {
    size_t n;
    double best, cpu; /* rank 0 writes them: the slowest rank's best time, its CPU time */
} bench_args;

static double cpu_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); /* all threads: the comm thread does the work */
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int sc_bench(dt_shm_world *w, int rank, int world, void *arg) {
    (void)world;
    bench_args *b = arg;
    dt_comm *c = join(w, rank, 60);
    float *buf = malloc(b->n * sizeof(float));
    CHECK(buf);
    for (size_t i = 0; i < b->n; i++) buf[i] = (float)(i & 1023);
    double best[2] = {1e30, 0}; /* wall, CPU */
    for (int it = 0; it < 6; it++) { /* the first one warms up (page faults) */
        CHECK_OK(dt_comm_barrier(c));
        double t0 = now_s(), c0 = cpu_s();
        CHECK_OK(dt_comm_allreduce(c, buf, b->n, DT_REDUCE_SUM));
        double t = now_s() - t0, u = cpu_s() - c0;
        if (it > 0 && t < best[0]) best[0] = t, best[1] = u;
    }
    /* the slowest rank defines the collective's time */
    double all[64][2];
    CHECK_OK(dt_comm_allgather(c, best, sizeof best, all));
    if (rank == 0)
        for (int r = 0; r < dt_comm_world(c); r++)
            if (all[r][0] >= b->best) b->best = all[r][0], b->cpu = all[r][1];
    free(buf);
    dt_comm_free(c);
    return 0;
}

static void timing(void) {
    const size_t bytes = (size_t)64 << 20;
    bench_args *b = mmap(NULL, sizeof *b, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(b != MAP_FAILED);
    b->n = bytes / sizeof(float);
    run_world("timing all-reduce 64 MiB", 2, 0, sc_bench, NULL, b);
    char *src = malloc(bytes), *dst = malloc(bytes);
    CHECK(src && dst);
    memset(src, 1, bytes);
    memset(dst, 2, bytes);
    double best = 1e30;
    for (int it = 0; it < 5; it++) {
        double t0 = now_s();
        memcpy(dst, src, bytes);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    CHECK(dst[12345] == 1);
    /* nccl-tests: algbw = bytes / time, busbw = algbw * 2(n-1)/n for all-reduce */
    double algbw = (double)bytes / b->best / 1e9, busbw = algbw * 2.0 * (2 - 1) / 2;
    double mbw = (double)bytes / best / 1e9;
    printf("timing (best of 5): all-reduce 64 MiB, 2 workers: %.2f ms, algbw %.2f GB/s, busbw %.2f GB/s | "
           "memcpy 64 MiB, 1 thread: %.2f GB/s | busbw/memcpy = %.0f%%\n",
           b->best * 1e3, algbw, busbw, mbw, 100 * busbw / mbw);
    /* with other load on the machine a rank is off-CPU part of the time: say so */
    printf("  (the slower rank was on a CPU %.0f%% of that time; busbw from its CPU time: %.2f GB/s = %.0f%% of "
           "memcpy)\n", 100 * b->cpu / b->best, (double)bytes / b->cpu / 1e9, 100 * (double)bytes / b->cpu / 1e9 / mbw);
    free(src);
    free(dst);
    munmap(b, sizeof *b);
}

int main(int argc, char **argv) {
    g_small = argc > 1 && strcmp(argv[1], "--small") == 0;
    atexit(kill_kids);
    unsetenv("DTRAIN_TEST_BREAK_ALLREDUCE");
    static char before[512][256], after[512][256];
    int nbefore = list_dev_shm(before, 512);

    test_arguments();
    test_segment_owner_mode();
    test_segment_scribble();
    if (argc > 1 && strcmp(argv[1], "segments") == 0) return 0;
    test_dead_ranks();
    if (argc > 1 && strcmp(argv[1], "dead") == 0) return 0;

    const int worlds[] = {1, 2, 3, 4, 7};
    for (int wi = 0; wi < 5; wi++) {
        int n = worlds[wi];
        ar_args a = {.lens = {0, 1, (size_t)(n - 1), g_small ? 4099 : ((size_t)1 << 20) + 3}, .nlens = 4};
        char name[64];
        snprintf(name, sizeof name, "all-reduce sum/avg, lengths 0, 1, %d, %zu", n - 1, a.lens[3]);
        run_world(name, n, 0, sc_allreduce, NULL, &a);
        /* slots of 4 KiB: many chunks, and a length that is no multiple of the chunk */
        a = (ar_args){.lens = {a.lens[3], 1000}, .nlens = 2};
        snprintf(name, sizeof name, "all-reduce through 4 KiB slots, lengths %zu, 1000", a.lens[0]);
        run_world(name, n, 4096, sc_allreduce, NULL, &a);
    }
    run_world("async buckets + broadcast in between", 3, 4096, sc_async, NULL, NULL);
    run_world("async buckets + broadcast in between", 2, 0, sc_async, NULL, NULL);
    for (int wi = 0; wi < 5; wi++) {
        const int n = worlds[wi];
        ar_args a = {.lens = {0, 1, (size_t)(n - 1), (size_t)n * 7 + 3, g_small ? 4099 : ((size_t)1 << 20) + 3},
                     .nlens = 5};
        run_world("reduce-scatter + all-gather of parts", n, 0, sc_parts, NULL, &a);
        a = (ar_args){.lens = {a.lens[4], 1000}, .nlens = 2}; /* many rounds through small slots */
        run_world("reduce-scatter + all-gather of parts through 4 KiB slots", n, 4096, sc_parts, NULL, &a);
    }
    run_world("timeout: rank 2 never comes to a reduce-scatter", 3, 0, sc_parts_timeout, NULL, NULL);
    for (int wi = 0; wi < 5; wi++) {
        const int n = worlds[wi];
        ar_args a = {.lens = {0, 1, (size_t)n * 7 + 3, g_small ? 4099 : ((size_t)1 << 20) + 3}, .nlens = 4};
        run_world("bf16 on the wire: all-reduce sum/avg, reduce-scatter", n, 0, sc_bf16, NULL, &a);
        a = (ar_args){.lens = {a.lens[3], 1000}, .nlens = 2};
        run_world("bf16 on the wire through 4 KiB slots", n, 4096, sc_bf16, NULL, &a);
    }

    _Atomic int *counter = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(counter != MAP_FAILED);
    for (int n = 2; n <= 4; n++) {
        atomic_store(counter, 0);
        run_world("broadcast (root N-1, 256-byte slots), all-gather, barrier", n, 256, sc_bcast_gather_barrier,
                  NULL, counter);
    }
    munmap(counter, 4096);

    run_world("timeout: rank 2 never comes", 3, 0, sc_timeout, NULL, NULL);
    run_world("abort by the supervisor", 4, 0, sc_abort, parent_abort, NULL);
    run_world("mismatched collectives", 2, 0, sc_mismatch, NULL, NULL);
    run_world("mismatched wire types (bf16 against fp32)", 2, 0, sc_wire_mismatch, NULL, NULL);

    CHECK(setenv("DTRAIN_TEST_BREAK_ALLREDUCE", "1", 1) == 0);
    run_world("DTRAIN_TEST_BREAK_ALLREDUCE=1", 3, 0, sc_break, NULL, NULL);
    CHECK(unsetenv("DTRAIN_TEST_BREAK_ALLREDUCE") == 0);

    /* the tcp ring backend through the same scenarios (socket pairs stand in for the network) */
    g_tcp = 1;
    for (int wi = 0; wi < 5; wi++) {
        int n = worlds[wi];
        ar_args a = {.lens = {0, 1, (size_t)(n - 1), g_small ? 4099 : ((size_t)1 << 20) + 3, 1000}, .nlens = 5};
        run_world("all-reduce sum/avg over the ring", n, 0, sc_allreduce, NULL, &a);
    }
    run_world("async buckets + broadcast in between", 3, 0, sc_async, NULL, NULL);
    for (int wi = 0; wi < 5; wi++) {
        const int n = worlds[wi];
        ar_args a = {.lens = {0, 1, (size_t)(n - 1), (size_t)n * 7 + 3, g_small ? 4099 : ((size_t)1 << 20) + 3},
                     .nlens = 5};
        run_world("reduce-scatter + all-gather of parts over the ring", n, 0, sc_parts, NULL, &a);
    }
    run_world("timeout: rank 2 never comes to a reduce-scatter", 3, 0, sc_parts_timeout, NULL, NULL);
    for (int wi = 0; wi < 5; wi++) {
        const int n = worlds[wi];
        ar_args a = {.lens = {0, 1, (size_t)n * 7 + 3, g_small ? 4099 : ((size_t)1 << 20) + 3}, .nlens = 4};
        run_world("bf16 on the wire over the ring", n, 0, sc_bf16, NULL, &a);
    }
    counter = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    CHECK(counter != MAP_FAILED);
    for (int n = 2; n <= 4; n++) {
        atomic_store(counter, 0);
        run_world("broadcast (root N-1), all-gather, barrier", n, 0, sc_bcast_gather_barrier, NULL, counter);
    }
    munmap(counter, 4096);
    run_world("mismatched collectives", 2, 0, sc_mismatch, NULL, NULL);
    run_world("mismatched wire types (bf16 against fp32)", 2, 0, sc_wire_mismatch, NULL, NULL);
    run_world("timeout: rank 1 never comes", 2, 0, sc_timeout_tcp, NULL, NULL);
    g_tcp = 0;

    /* the hierarchical collective through the same scenarios */
    {
        ar_args a = {.lens = {0, 1, 3, 31, g_small ? 4099 : ((size_t)1 << 20) + 3}, .nlens = 5};
        run_hier("all-reduce sum/avg", sc_allreduce, &a);
        run_hier("async buckets + broadcast in between", sc_async, NULL);
        run_hier("reduce-scatter + all-gather of parts", sc_parts, &a);
        ar_args b = {.lens = {0, 1, 31, g_small ? 4099 : ((size_t)1 << 20) + 3}, .nlens = 4};
        run_hier("bf16 between the hosts: all-reduce sum/avg, reduce-scatter", sc_bf16, &b);
        counter = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        CHECK(counter != MAP_FAILED);
        atomic_store(counter, 0);
        run_hier("broadcast (root 3), all-gather, barrier", sc_bcast_gather_barrier, counter);
        munmap(counter, 4096);
        run_hier("bytes between the hosts: the leaders' ring only", sc_hier_bytes, NULL);
    }

    int nafter = list_dev_shm(after, 512);
    for (int i = 0; i < nafter; i++) {
        int found = 0;
        for (int j = 0; j < nbefore && !found; j++) found = strcmp(after[i], before[j]) == 0;
        if (!found) fprintf(stderr, "new in /dev/shm: %s\n", after[i]);
        CHECK(found);
    }
    printf("/dev/shm unchanged (%d entries)\n", nafter);

    if (!g_small) timing();
    printf("test_comm: ok\n");
    return 0;
}
