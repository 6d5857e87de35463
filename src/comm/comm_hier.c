/* comm_hier.c — the hierarchical collective (training.hierarchical_allreduce): ranks on several
 * hosts, more than one on each, host by host in rank order (host h holds ranks h*L .. h*L+L-1).
 * Two communicators of its own: `local`, the L ranks of this host (shm), and on each host's
 * first rank, the leader, `leaders`, the ring of the H leaders (tcp). Only the leaders' ring
 * crosses between hosts:
 *
 *   all-reduce      local all-reduce (float32, in memory), the leaders' all-reduce (as asked:
 *                   fp32 or bf16 on the wire), local broadcast from the leader: every rank gets
 *                   the leader's bits
 *   reduce-scatter  the all-reduce (every part then holds its sum: this rank's part too)
 *   all-gather of parts  the other ranks' parts zeroed, then the all-reduce of float32 (x + 0 is
 *                   x): twice an all-gather's bytes, over the leaders' ring only
 *   broadcast       on the root's host, local broadcast to its leader; the leaders' broadcast
 *                   from the root's host; local broadcast from each leader
 *   all-gather      local all-gather to the leader, the leaders' all-gather of the host blocks
 *                   (rank order is host order), local broadcast of the whole
 *   barrier         local, leaders, local
 *
 * The sub-communicators keep their own deadlines (comm.c: one per wait); a failure of either
 * fails the collective with its message. The bytes this rank sent are the sub-communicators'
 * (dt_comm_bytes_sent), those between hosts the leaders' ring's. */
#include "dtrain/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct hier_ctx {
    dt_comm *local, *leaders; /* leaders: NULL on the other ranks */
    int rank, world, local_rank, local_world, host, hosts;
} hier_ctx;

static dt_status hier_allreduce(void *vctx, float *buf, size_t n, dt_reduce_op op, dt_wire wire,
                                const dt_comm_deadline *dl) {
    (void)dl;
    hier_ctx *x = vctx;
    if (n == 0) return DT_OK;
    DT_TRY(dt_comm_allreduce(x->local, buf, n, DT_REDUCE_SUM));
    if (x->leaders) {
        dt_comm_req *req;
        DT_TRY(dt_comm_allreduce_start(x->leaders, buf, n, DT_REDUCE_SUM, wire, &req));
        DT_TRY(dt_comm_wait(x->leaders, req));
        if (op == DT_REDUCE_AVG)
            for (size_t i = 0; i < n; i++) buf[i] /= (float)x->world;
    }
    return dt_comm_broadcast(x->local, buf, n * sizeof(float), 0);
}

static dt_status hier_reduce_scatter(void *vctx, float *buf, size_t n, dt_wire wire, const dt_comm_deadline *dl) {
    return hier_allreduce(vctx, buf, n, DT_REDUCE_SUM, wire, dl);
}

static dt_status hier_allgather_parts(void *vctx, float *buf, size_t n, const dt_comm_deadline *dl) {
    hier_ctx *x = vctx;
    if (n == 0) return DT_OK;
    size_t lo, hi;
    dt_comm_part(n, x->world, x->rank, &lo, &hi);
    memset(buf, 0, lo * sizeof(float));
    memset(buf + hi, 0, (n - hi) * sizeof(float));
    return hier_allreduce(vctx, buf, n, DT_REDUCE_SUM, DT_WIRE_F32, dl);
}

static dt_status hier_broadcast(void *vctx, void *buf, size_t bytes, int root, const dt_comm_deadline *dl) {
    (void)dl;
    hier_ctx *x = vctx;
    const int root_host = root / x->local_world;
    if (x->host == root_host && root % x->local_world != 0)
        DT_TRY(dt_comm_broadcast(x->local, buf, bytes, root % x->local_world));
    if (x->leaders) DT_TRY(dt_comm_broadcast(x->leaders, buf, bytes, root_host));
    return dt_comm_broadcast(x->local, buf, bytes, 0);
}

static dt_status hier_allgather(void *vctx, const void *in, size_t bytes, void *out, const dt_comm_deadline *dl) {
    (void)dl;
    hier_ctx *x = vctx;
    const size_t block = (size_t)x->local_world * bytes; /* this host's ranks, in rank order */
    char *mine = (char *)out + (size_t)x->host * block;
    DT_TRY(dt_comm_allgather(x->local, in, bytes, mine));
    if (x->leaders) {
        /* the leaders' all-gather wants its input apart from its output */
        void *copy = dt_malloc(block ? block : 1, "hierarchical all-gather");
        if (!copy) return DT_ERR_NOMEM;
        memcpy(copy, mine, block);
        dt_status st = dt_comm_allgather(x->leaders, copy, block, out);
        free(copy);
        DT_TRY(st);
    }
    return dt_comm_broadcast(x->local, out, block * (size_t)x->hosts, 0);
}

static dt_status hier_barrier(void *vctx, const dt_comm_deadline *dl) {
    hier_ctx *x = vctx;
    DT_TRY(dt_comm_barrier_timeout(x->local, dl->timeout_s));
    if (x->leaders) DT_TRY(dt_comm_barrier_timeout(x->leaders, dl->timeout_s));
    return dt_comm_barrier_timeout(x->local, dl->timeout_s);
}

static uint64_t hier_sent(void *vctx, int remote_only) {
    hier_ctx *x = vctx;
    uint64_t leaders = x->leaders ? dt_comm_bytes_sent(x->leaders) : 0;
    return remote_only ? leaders : leaders + dt_comm_bytes_sent(x->local);
}

static void hier_free(void *vctx) {
    hier_ctx *x = vctx;
    if (!x) return;
    dt_comm_free(x->leaders);
    dt_comm_free(x->local);
    free(x);
}

static const dt_comm_backend_ops hier_backend = {
    .name = "tcp+shm",
    .allreduce = hier_allreduce,
    .broadcast = hier_broadcast,
    .allgather = hier_allgather,
    .reduce_scatter = hier_reduce_scatter,
    .allgather_parts = hier_allgather_parts,
    .barrier = hier_barrier,
    .free = hier_free,
    .sent = hier_sent,
};

dt_status dt_comm_init_hier(dt_comm **out, dt_comm *local, dt_comm *leaders, int rank, int world, double timeout_s) {
    *out = NULL;
    const int L = local ? dt_comm_world(local) : 0;
    dt_status st = DT_OK;
    if (!local || L < 1 || world % L != 0 || dt_comm_rank(local) != rank % L || (rank % L == 0) != (leaders != NULL) ||
        (leaders && (dt_comm_world(leaders) != world / L || dt_comm_rank(leaders) != rank / L)))
        st = dt_error_set(DT_ERR_INTERNAL, "hierarchical collective: rank %d of %d: the host's communicator (%d of %d) "
                          "and the leaders' (%s) do not fit", rank, world, local ? dt_comm_rank(local) : -1, L,
                          leaders ? "given" : "none");
    hier_ctx *x = st == DT_OK ? dt_calloc(1, sizeof *x, "hierarchical communicator") : NULL;
    if (st == DT_OK && !x) st = DT_ERR_NOMEM;
    if (st != DT_OK) {
        dt_comm_free(leaders);
        dt_comm_free(local);
        return st;
    }
    *x = (hier_ctx){.local = local, .leaders = leaders, .rank = rank, .world = world, .local_rank = rank % L,
                    .local_world = L, .host = rank / L, .hosts = world / L};
    return dt_comm_create(out, &hier_backend, x, rank, world, timeout_s);
}
