/* comm_mpi.c — the `mpi` collective backend (Open MPI; built when CMake finds it): CPU
 * workers started by mpirun or srun, on one machine or several.
 *
 * Every collective is MPI's non-blocking form (MPI_Iallreduce, MPI_Ibcast, MPI_Iallgather,
 * MPI_Ireduce_scatter, MPI_Iallgatherv, MPI_Ibarrier) followed by MPI_Test polling until it completes or the deadline passes, so
 * a dead or stopped peer makes the call fail with a message instead of hanging (MPI itself
 * has no timeouts). All MPI calls run on the communicator's thread, one at a time
 * (MPI_THREAD_SERIALIZED); MPI_Init and MPI_Finalize happen on the main thread while no
 * collective is queued. */
#include "dtrain/comm_mpi.h"

#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtrain/bf16.h"
#include "dtrain/clock.h"

typedef struct mpi_ctx {
    MPI_Comm comm;        /* MPI_COMM_WORLD, or a group's (dt_comm_init_mpi_split: freed with the context) */
    int rank, world;
    int job_rank;         /* in MPI_COMM_WORLD: what messages name */
    unsigned long seq;
    int *counts, *displs; /* (world) the parts of a reduce-scatter or all-gather of parts */
    uint16_t *w16;        /* DT_WIRE_BF16: the buffer as it travels */
    size_t n16;
    MPI_Op bf16_sum;      /* sums bf16 pairs in float32 */
} mpi_ctx;

/* The reduction of DT_WIRE_BF16: MPI has no bf16 type, so 16-bit words summed in float32 and
 * rounded back. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = dt_float_to_bf16(dt_bf16_to_float(a[i]) + dt_bf16_to_float(b[i]));
}

/* buf(n) as bf16 in x->w16 */
static dt_status to_wire(mpi_ctx *x, const float *buf, size_t n) {
    if (x->n16 < n) {
        uint16_t *p = realloc(x->w16, n * sizeof *p);
        if (!p) return dt_error_set(DT_ERR_NOMEM, "mpi: out of memory for %zu bf16 values", n);
        x->w16 = p;
        x->n16 = n;
    }
    dt_bf16_pack(x->w16, buf, n);
    return DT_OK;
}

static dt_status mpi_fail(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS) snprintf(msg, sizeof msg, "error %d", rc);
    return dt_error_set(DT_ERR_DEVICE, "mpi: %s failed: %s", what, msg);
}

/* Polls `req` until it completes or the deadline passes. */
static dt_status wait_req(mpi_ctx *x, MPI_Request *req, const char *what, const dt_comm_deadline *dl) {
    x->seq++;
    double deadline = dt_clock_now() + dl->timeout_s;
    for (unsigned spin = 0;; spin++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, what);
        if (done) return DT_OK;
        if ((spin & 255) == 255) {
            if (dt_clock_now() > deadline)
                return dt_error_set(DT_ERR_DEVICE,
                                    "collective timeout: %s #%lu on rank %d waited %.1f s for the other ranks (hint: a "
                                    "worker is stuck, stopped or dead; mpirun names the rank that exited%s)",
                                    what, x->seq, x->job_rank, dl->timeout_s, dl->setting);
            struct timespec ts = {0, 20000}; /* 20 us: MPI progresses inside MPI_Test */
            nanosleep(&ts, NULL);
        }
    }
}

static dt_status mpi_allreduce(void *vctx, float *buf, size_t n, dt_reduce_op op, dt_wire wire,
                               const dt_comm_deadline *dl) {
    mpi_ctx *x = vctx;
    if (n == 0) return DT_OK;
    if (n > (size_t)INT32_MAX) return dt_error_set(DT_ERR_INTERNAL, "mpi: all-reduce of %zu floats is too large", n);
    const int bf = wire == DT_WIRE_BF16;
    if (bf) DT_TRY(to_wire(x, buf, n));
    MPI_Request req;
    int rc = bf ? MPI_Iallreduce(MPI_IN_PLACE, x->w16, (int)n, MPI_UINT16_T, x->bf16_sum, x->comm, &req)
                : MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, x->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Iallreduce");
    DT_TRY(wait_req(x, &req, "all-reduce", dl));
    if (bf) dt_bf16_unpack(buf, x->w16, n);
    if (op == DT_REDUCE_AVG)
        for (size_t i = 0; i < n; i++) buf[i] = bf ? dt_bf16_round(buf[i] / (float)x->world) : buf[i] / (float)x->world;
    return DT_OK;
}

static dt_status mpi_broadcast(void *vctx, void *buf, size_t bytes, int root, const dt_comm_deadline *dl) {
    mpi_ctx *x = vctx;
    if (bytes > (size_t)INT32_MAX) return dt_error_set(DT_ERR_INTERNAL, "mpi: broadcast of %zu bytes is too large", bytes);
    MPI_Request req;
    int rc = MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, x->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Ibcast");
    return wait_req(x, &req, "broadcast", dl);
}

static dt_status mpi_allgather(void *vctx, const void *in, size_t bytes, void *out, const dt_comm_deadline *dl) {
    mpi_ctx *x = vctx;
    if (bytes > (size_t)INT32_MAX) return dt_error_set(DT_ERR_INTERNAL, "mpi: all-gather of %zu bytes is too large", bytes);
    MPI_Request req;
    int rc = MPI_Iallgather(in, (int)bytes, MPI_BYTE, out, (int)bytes, MPI_BYTE, x->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Iallgather");
    return wait_req(x, &req, "all-gather", dl);
}

/* counts and displacements of the parts of n floats (dt_comm_part) */
static dt_status set_parts(mpi_ctx *x, size_t n, const char *what) {
    if (n > (size_t)INT32_MAX) return dt_error_set(DT_ERR_INTERNAL, "mpi: %s of %zu floats is too large", what, n);
    for (int q = 0; q < x->world; q++) {
        size_t lo, hi;
        dt_comm_part(n, x->world, q, &lo, &hi);
        x->displs[q] = (int)lo;
        x->counts[q] = (int)(hi - lo);
    }
    return DT_OK;
}

/* In place, MPI puts this rank's result at the start of the buffer: moved to its part. */
static dt_status mpi_reduce_scatter(void *vctx, float *buf, size_t n, dt_wire wire, const dt_comm_deadline *dl) {
    mpi_ctx *x = vctx;
    const int bf = wire == DT_WIRE_BF16;
    if (n == 0) return DT_OK;
    if (x->world == 1) {
        if (bf) dt_bf16_round_all(buf, n); /* as it would travel */
        return DT_OK;
    }
    DT_TRY(set_parts(x, n, "reduce-scatter"));
    if (bf) DT_TRY(to_wire(x, buf, n));
    MPI_Request req;
    int rc = bf ? MPI_Ireduce_scatter(MPI_IN_PLACE, x->w16, x->counts, MPI_UINT16_T, x->bf16_sum, x->comm, &req)
                : MPI_Ireduce_scatter(MPI_IN_PLACE, buf, x->counts, MPI_FLOAT, MPI_SUM, x->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Ireduce_scatter");
    DT_TRY(wait_req(x, &req, "reduce-scatter", dl));
    float *mine = buf + x->displs[x->rank];
    const size_t len = (size_t)x->counts[x->rank];
    if (bf) dt_bf16_unpack(mine, x->w16, len);
    else
        memmove(mine, buf, len * sizeof(float));
    return DT_OK;
}

static dt_status mpi_allgather_parts(void *vctx, float *buf, size_t n, const dt_comm_deadline *dl) {
    mpi_ctx *x = vctx;
    if (n == 0 || x->world == 1) return DT_OK;
    DT_TRY(set_parts(x, n, "all-gather of parts"));
    MPI_Request req;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, x->counts, x->displs, MPI_FLOAT, x->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Iallgatherv");
    return wait_req(x, &req, "all-gather of parts", dl);
}

static dt_status mpi_barrier(void *vctx, const dt_comm_deadline *dl) {
    mpi_ctx *x = vctx;
    MPI_Request req;
    int rc = MPI_Ibarrier(x->comm, &req);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Ibarrier");
    return wait_req(vctx, &req, "barrier", dl);
}

static void mpi_free_ctx(void *vctx) {
    mpi_ctx *x = vctx;
    if (!x) return;
    free(x->counts);
    free(x->displs);
    free(x->w16);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (x->comm != MPI_COMM_WORLD && !finalized) MPI_Comm_free(&x->comm);
    free(x); /* bf16_sum lives until MPI_Finalize: the communicator may be freed after it */
}

static const dt_comm_backend_ops mpi_backend = {
    .name = "mpi",
    .allreduce = mpi_allreduce,
    .broadcast = mpi_broadcast,
    .allgather = mpi_allgather,
    .reduce_scatter = mpi_reduce_scatter,
    .allgather_parts = mpi_allgather_parts,
    .barrier = mpi_barrier,
    .free = mpi_free_ctx,
};

dt_status dt_mpi_init(int *rank, int *world, int groups) {
    int provided = 0, inited = 0;
    MPI_Initialized(&inited);
    const int want = groups ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED;
    if (!inited) {
        int rc = MPI_Init_thread(NULL, NULL, want, &provided);
        if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Init_thread");
        if (provided < want)
            return dt_error_set(DT_ERR_DEVICE, "mpi: the MPI library offers thread level %d, dtrain needs %s (%d)%s",
                                provided, groups ? "MPI_THREAD_MULTIPLE" : "MPI_THREAD_SERIALIZED", want,
                                groups ? " for the model-parallel groups' collectives, each on its own thread (hint: an "
                                         "Open MPI built with thread support, or the ranks of one host with "
                                         "training.communication_backend: auto)" : "");
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);
    return DT_OK;
}

void dt_mpi_finalize(int exit_code) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (!inited || finalized) return;
    fflush(NULL);
    if (exit_code) MPI_Abort(MPI_COMM_WORLD, exit_code); /* peers may wait in a collective: end the job */
    else MPI_Finalize();
}

int dt_mpi_version(char *buf, size_t n) {
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    if (MPI_Get_library_version(lib, &len) != MPI_SUCCESS) snprintf(lib, sizeof lib, "?");
    lib[strcspn(lib, ",\n")] = '\0'; /* "Open MPI v4.1.4, package: ..." -> "Open MPI v4.1.4" */
    char built[64];
#ifdef OMPI_MAJOR_VERSION
    snprintf(built, sizeof built, "Open MPI v%d.%d.%d", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION);
#else
    snprintf(built, sizeof built, "MPI %d.%d", MPI_VERSION, MPI_SUBVERSION);
#endif
    int bad = strstr(lib, built) == NULL && strncmp(built, "MPI ", 4) != 0;
    snprintf(buf, n, "  %-9s %s (built with %s)%s\n", "MPI", lib, built, bad ? "  MISMATCH" : "");
    return bad;
}

/* a communicator over `comm` (owned by it unless MPI_COMM_WORLD) */
static dt_status init_on(dt_comm **out, MPI_Comm comm, double timeout_s) {
    *out = NULL;
    mpi_ctx *x = dt_calloc(1, sizeof *x, "mpi communicator");
    if (!x) {
        if (comm != MPI_COMM_WORLD) MPI_Comm_free(&comm);
        return DT_ERR_NOMEM;
    }
    x->comm = comm;
    MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm, &x->rank);
    MPI_Comm_size(comm, &x->world);
    MPI_Comm_rank(MPI_COMM_WORLD, &x->job_rank);
    x->counts = dt_calloc((size_t)x->world, sizeof *x->counts, "mpi part counts");
    x->displs = dt_calloc((size_t)x->world, sizeof *x->displs, "mpi part offsets");
    if (!x->counts || !x->displs) {
        mpi_free_ctx(x);
        return DT_ERR_NOMEM;
    }
    int rc = MPI_Op_create(bf16_sum, 1, &x->bf16_sum);
    if (rc != MPI_SUCCESS) {
        mpi_free_ctx(x);
        return mpi_fail(rc, "MPI_Op_create");
    }
    return dt_comm_create(out, &mpi_backend, x, x->rank, x->world, timeout_s);
}

dt_status dt_comm_init_mpi(dt_comm **out, double timeout_s) { return init_on(out, MPI_COMM_WORLD, timeout_s); }

dt_status dt_comm_init_mpi_split(dt_comm **out, int color, int key, double timeout_s) {
    *out = NULL;
    MPI_Comm comm;
    int rc = MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, key, &comm);
    if (rc != MPI_SUCCESS) return mpi_fail(rc, "MPI_Comm_split");
    return color < 0 ? DT_OK : init_on(out, comm, timeout_s);
}
