/* comm.h — collectives between the workers of one job: all-reduce (sum/avg, float32),
 * broadcast, all-gather, barrier, and a non-blocking all-reduce of one contiguous range
 * (one gradient bucket) so that a layer's gradients are reduced while backward goes on;
 * for optimizer sharding (training.zero_stage 1) a reduce-scatter and an all-gather of the
 * parts of one float buffer (dt_comm_part), started the same way.
 *
 * Backends behind one interface: `shm` (CPU workers on one host: a shared mapping made by
 * the launcher before fork), later `nccl` (GPUs) and `mpi`. Every collective is queued on
 * the communicator's own thread and runs in issue order, so all ranks must issue the same
 * collectives in the same order (blocking calls are "start + wait").
 *
 * Every wait has a deadline (training.collective_timeout_s). On expiry the call fails
 * with DT_ERR_DEVICE and a message naming the operation and the rank(s) that did not
 * arrive; the communicator is then unusable (every later call fails at once). */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/config.h"
#include "dtrain/status.h"

typedef enum { DT_REDUCE_SUM = 0, DT_REDUCE_AVG } dt_reduce_op;

/* dt_wire (config.h, training.grad_comm_dtype): how a gradient all-reduce or reduce-scatter
 * travels:
 *   DT_WIRE_F32   as the float32 it is;
 *   DT_WIRE_BF16  as bfloat16, half the bytes, summed in float32: each rank's values are
 *                 rounded to bf16 before they leave it, and so is every partial sum that
 *                 travels on (a ring's); an all-reduce's result is rounded to bf16 as well, so
 *                 that every rank holds the same bits; a reduce-scatter's part is its float32
 *                 sum on shm and tcp (mpi and nccl reduce in bf16 storage: rounded).
 * No error feedback: the rounding's residual is dropped, not carried to the next step. The
 * hierarchical collective sums inside a host in float32 and rounds only what its leaders send. */

/* ---- the shared world (shm backend) ----
 * Made by the launcher BEFORE fork with an anonymous shared mapping, so it is inherited by
 * every worker and disappears with the last process: nothing is ever left in /dev/shm.
 * `slot_bytes` bounds the chunk one all-reduce step moves (larger buffers are reduced in
 * chunks); 0 picks a default. Destroy only after every worker has exited. */
typedef struct dt_shm_world dt_shm_world;
dt_status dt_shm_world_create(dt_shm_world **out, int world, size_t slot_bytes);
void dt_shm_world_destroy(dt_shm_world *w);
/* The same world in the file behind `fd` (e.g. shm_open), for workers that do not share a
 * parent (external launchers): one process creates it (sizing the file), the others attach;
 * each destroys its own mapping. Attaching checks that the file is this user's with mode 0600
 * (else DT_ERR_USAGE naming the segment `name`: someone else's), then reads the sizes once,
 * checks them and keeps its own copy: a process that writes over the shared block later cannot
 * move this rank's slots. DT_ERR_DEVICE while the creator has not finished it (try again). */
dt_status dt_shm_world_create_fd(dt_shm_world **out, int world, size_t slot_bytes, int fd);
dt_status dt_shm_world_attach_fd(dt_shm_world **out, int world, int fd, const char *name);
/* Says that this process is rank `rank` of w (`grank` in the job, for messages): its pid, so
 * that the ranks waiting for it in a collective notice at once when it exits or is killed, and
 * fail naming it instead of waiting for their deadline (dtrain's own launcher, which watches
 * its workers itself, does not call this). Returns 1 when every rank of w has now joined (the
 * caller may remove the segment's name: nobody else needs it), else 0. */
int dt_shm_world_join(dt_shm_world *w, int rank, int grank);
/* Only the name: rank `rank` of w is `grank` in the job, for the messages of a world that
 * holds some of the job's ranks (a model-parallel group: launch.c). */
void dt_shm_world_name_rank(dt_shm_world *w, int rank, int grank);
/* Marks the world aborted (by the supervisor, when a worker died): every rank's pending and
 * future collective fails promptly with a message containing `why`. Async-signal-safe. */
void dt_shm_world_abort(dt_shm_world *w, const char *why);

typedef struct dt_comm dt_comm;
typedef struct dt_comm_req dt_comm_req;

/* Joins `w` as `rank` (0 <= rank < world). timeout_s > 0. dt_comm_free accepts NULL;
 * it waits for queued collectives to finish (or fail) first. */
dt_status dt_comm_init_shm(dt_comm **out, dt_shm_world *w, int rank, double timeout_s);
void dt_comm_free(dt_comm *c);

int dt_comm_rank(const dt_comm *c);
int dt_comm_world(const dt_comm *c);
const char *dt_comm_backend(const dt_comm *c); /* "shm" */
/* The bytes this rank has sent in the collectives issued so far, counted as a ring moves them
 * (nccl-tests' busbw convention): an all-reduce of B bytes 2(N-1)/N x B, a broadcast (N-1)/N x B
 * (a chain's average), an all-gather of B bytes per rank (N-1) x B, a reduce-scatter or an
 * all-gather of parts of a B-byte buffer (N-1)/N x B, where B counts 2 bytes a float for
 * DT_WIRE_BF16. That is the data the tcp
 * ring's all-reduce and all-gather send (its small per-collective headers, and barriers, are not
 * counted); shm, mpi and nccl move the same data by routes of their own. */
uint64_t dt_comm_bytes_sent(dt_comm *c);
/* Of those, the bytes that went to another host: all of them once dt_comm_mark_remote said this
 * rank's ring successor is on another host, none otherwise; a composite communicator (the
 * hierarchical one) counts its parts'. */
uint64_t dt_comm_bytes_remote(dt_comm *c);
void dt_comm_mark_remote(dt_comm *c);

/* The part of a buffer of n floats that `rank` of `world` owns in a reduce-scatter or an
 * all-gather of parts: [n*rank/world, n*(rank+1)/world). Parts differ by at most one float;
 * every backend and the optimizer's shard use this one split. */
static inline void dt_comm_part(size_t n, int world, int rank, size_t *lo, size_t *hi) {
    *lo = (size_t)((uint64_t)n * (uint64_t)rank / (uint64_t)world);
    *hi = (size_t)((uint64_t)n * (uint64_t)(rank + 1) / (uint64_t)world);
}

/* In place: buf(n) = reduction over ranks of buf(n). n may be 0. */
dt_status dt_comm_allreduce(dt_comm *c, float *buf, size_t n, dt_reduce_op op);
/* In place: the sum over ranks of bf16 values buf(n) (tensor parallelism's activations on a
 * device with bf16 activations), rounded to bf16: NCCL sums them as bf16; a backend without its
 * own (host memory) sums them as floats and rounds once. n may be 0. */
dt_status dt_comm_allreduce_bf16(dt_comm *c, uint16_t *buf, size_t n);
/* Starts an all-reduce; `buf` must not be touched until dt_comm_wait returns. *req is
 * released by dt_comm_wait, which returns the operation's status. */
dt_status dt_comm_allreduce_start(dt_comm *c, float *buf, size_t n, dt_reduce_op op, dt_wire wire, dt_comm_req **req);
/* (When start fails, *req is NULL and there is nothing to wait for; dt_comm_wait(c, NULL)
 * returns the communicator's first error, or DT_ERR_INTERNAL when there is none.) */
dt_status dt_comm_wait(dt_comm *c, dt_comm_req *req);
/* Reduce-scatter, in place: afterwards this rank's part of buf(n) (dt_comm_part) holds the
 * sum over ranks of that part; the rest of buf is unspecified. Start + wait as all-reduce. */
dt_status dt_comm_reduce_scatter_start(dt_comm *c, float *buf, size_t n, dt_wire wire, dt_comm_req **req);
dt_status dt_comm_reduce_scatter(dt_comm *c, float *buf, size_t n);
/* All-gather of parts, in place: afterwards every rank's buf(n) holds, in each rank's part,
 * what that rank had there. */
dt_status dt_comm_allgather_parts_start(dt_comm *c, float *buf, size_t n, dt_comm_req **req);
dt_status dt_comm_allgather_parts(dt_comm *c, float *buf, size_t n);
/* Says the most floats one DT_WIRE_BF16 all-reduce or reduce-scatter will carry (the largest
 * gradient bucket): a backend that converts them in a buffer of its own (nccl) allocates it now,
 * at start, so that no collective allocates device memory mid-step (a cudaFree there waits for
 * the whole device). Not a collective: only this rank's buffers; queued in issue order like one
 * (call it before the first bucket). Backends without such a buffer do nothing. */
dt_status dt_comm_reserve(dt_comm *c, size_t floats);
/* buf(bytes) of rank `root` copied to every rank. */
dt_status dt_comm_broadcast(dt_comm *c, void *buf, size_t bytes, int root);
/* out(world * bytes): rank r's `in` at out + r * bytes, on every rank. */
dt_status dt_comm_allgather(dt_comm *c, const void *in, size_t bytes, void *out);
dt_status dt_comm_barrier(dt_comm *c);
/* A barrier with its own deadline (> 0), for waits that are long by nature (e.g. while
 * rank 0 writes a checkpoint); 0 means the communicator's deadline. */
dt_status dt_comm_barrier_timeout(dt_comm *c, double timeout_s);
/* The exposed time of the last collective that completed and waited for the caller's stream
 * (nccl): how long after the work queued there before its start had finished it finished, in
 * ms, measured on the device. After buckets started in turn as backward went on and then
 * waited for, that of the last one is the communication backward did not hide: the caller's
 * own wait would also count the backward still running on the device. NAN where the backend
 * does not measure it (shm, tcp, mpi, hierarchical: the work they overlap runs on the caller's
 * thread, so the caller's wait after it is the exposed time) or could not. Any thread. */
double dt_comm_last_exposed_ms(dt_comm *c);

/* ---- the tcp backend: a ring over TCP connections the rendezvous made (rendezvous.h);
 * next_fd goes to rank+1, prev_fd comes from rank-1; takes ownership of both. */
dt_status dt_comm_init_tcp(dt_comm **out, int rank, int world, int next_fd, int prev_fd, double timeout_s);

/* ---- the hierarchical collective (training.hierarchical_allreduce): ranks on H hosts, L on
 * each, host by host in rank order. `local` is this host's communicator (L ranks, this rank's
 * index rank % L), `leaders` the ring of the hosts' first ranks (H ranks, index rank / L; NULL on
 * the other ranks); both are taken over (freed with it, also when this fails). Gradients reduce
 * inside each host first, only the leaders exchange between hosts, and the result is shared
 * inside the host again (src/comm/comm_hier.c says how each collective runs).
 * dt_comm_backend: "tcp+shm". */
dt_status dt_comm_init_hier(dt_comm **out, dt_comm *local, dt_comm *leaders, int rank, int world, double timeout_s);

/* ---- the nccl backend (GPU buffers; CUDA builds only): NCCL, opened with dlopen on the
 * first call (CPU runs never load it). Collective over `boot`: every rank calls it.
 *   boot            a working host communicator of the same job (shm, tcp or mpi): rank and
 *                   world are taken from it, and it carries NCCL's unique id from rank 0 (in
 *                   fork mode: made by rank 0 after fork, passed through the launcher's
 *                   shared memory). Used only during this call.
 *   device          this rank's CUDA device; made current on the calling thread.
 *   compute_stream  the cudaStream_t (NULL: the legacy default stream) on which the buffers
 *                   are written: each collective (the barrier excepted) runs after the work
 *                   queued there before it was started. The result is complete on the device
 *                   when dt_comm_wait returns.
 * Buffers may be device memory of `device` (or managed memory), or host memory, which is
 * staged through a device buffer (meant for small things). A timeout or an NCCL error aborts
 * the NCCL communicator. Fails with DT_ERR_DEVICE when NCCL or the GPU is not usable (on every
 * rank when one rank cannot set up). dt_comm_backend: "nccl". */
dt_status dt_comm_init_nccl(dt_comm **out, dt_comm *boot, int device, void *compute_stream, double timeout_s);
/* The device memory such a communicator allocates itself: its staging buffer (made at init, 1 MiB;
 * grown by a collective on more host memory than that), and with `wire_floats` > 0 the bf16
 * buffer dt_comm_reserve makes for them (NCCL's own memory not counted). */
size_t dt_comm_nccl_device_bytes(size_t wire_floats);

/* ---- backend interface: for src/comm_<backend>.c only, never for callers ----
 * A backend is a table of blocking collectives. They all run on the communicator's own
 * thread, one at a time and in issue order, so a backend needs no locking of its own. On
 * failure one returns a status and records the message with dt_error_set (on that thread;
 * comm.c hands it to the waiting caller). `free` releases `ctx`; it may be NULL.
 *
 * A backend whose collectives run on a device queue (nccl) may also keep several in flight:
 * `issue` queues a float collective without waiting for it, and comm.c, still on its one
 * thread and in issue order, queues the next ones behind it and observes their completions
 * with `poll`, oldest first, handing each to its waiting caller as it completes. A collective
 * that `issue` declines runs blocking, once every collective in flight has completed.
 *
 * Deadlines are decided in comm.c, once per collective, and passed down: no backend keeps a
 * timeout of its own. A backend gives up when one wait inside the collective takes longer
 * than dl->timeout_s, and its message ends with dl->setting. */
typedef struct dt_comm_deadline {
    double timeout_s;    /* > 0: training.collective_timeout_s, or a barrier's own deadline */
    const char *setting; /* for the message: "; training.collective_timeout_s sets the deadline", or "" */
} dt_comm_deadline;

/* A float collective that `issue` may keep in flight: a gradient bucket's all-reduce or
 * reduce-scatter, or an all-gather of parts (wire DT_WIRE_F32) */
typedef enum { DT_COMM_ALLREDUCE, DT_COMM_REDUCE_SCATTER, DT_COMM_GATHER_PARTS } dt_comm_float_kind;
typedef struct dt_comm_float_op {
    dt_comm_float_kind kind;
    float *buf;
    size_t n;
    dt_reduce_op op; /* all-reduce */
    dt_wire wire;
} dt_comm_float_op;

typedef struct dt_comm_backend_ops {
    const char *name;
    dt_status (*allreduce)(void *ctx, float *buf, size_t n, dt_reduce_op op, dt_wire wire, const dt_comm_deadline *dl);
    dt_status (*broadcast)(void *ctx, void *buf, size_t bytes, int root, const dt_comm_deadline *dl);
    dt_status (*allgather)(void *ctx, const void *in, size_t bytes, void *out, const dt_comm_deadline *dl);
    /* sum into this rank's part of buf(n) / every part of buf(n) from its owner (dt_comm_part) */
    dt_status (*reduce_scatter)(void *ctx, float *buf, size_t n, dt_wire wire, const dt_comm_deadline *dl);
    dt_status (*allgather_parts)(void *ctx, float *buf, size_t n, const dt_comm_deadline *dl);
    dt_status (*barrier)(void *ctx, const dt_comm_deadline *dl);
    void (*free)(void *ctx);
    /* May be NULL (comm.c then sums the values as floats through allreduce): dt_comm_allreduce_bf16 */
    dt_status (*allreduce_bf16)(void *ctx, uint16_t *buf, size_t n, const dt_comm_deadline *dl);
    /* May be NULL. Runs on the CALLER's thread as each collective is queued, in issue order,
     * before the comm thread can run it: a GPU backend marks there how far the caller's stream
     * has got, so that the collective waits for exactly the work queued before it (a gradient
     * bucket) and not for what the caller queued since (the rest of backward). */
    void (*prepare)(void *ctx);
    /* May be NULL. dt_comm_reserve: buffers for bf16 collectives of up to `floats` floats, made
     * now (on the comm thread, in issue order) */
    dt_status (*reserve)(void *ctx, size_t floats);
    /* May be NULL. A composite backend's own count of what it sent (remote_only: to other
     * hosts), in place of comm.c's ring count (dt_comm_bytes_sent, dt_comm_bytes_remote). */
    uint64_t (*sent)(void *ctx, int remote_only);
    /* Several collectives in flight (all three, or none). max_in_flight (> 0): how many at once.
     * issue: queues `f` and returns without waiting for it, *issued 1; or declines (*issued 0,
     * DT_OK, nothing done, not even counted), and comm.c runs it with the blocking call once
     * nothing is in flight. dl points to comm.c's stack: a backend keeps a copy. poll: looks at
     * the oldest collective in flight once: *done 1 when it has completed; else it may nap a
     * little (never busy-waits long) and returns *done 0. A failure of issue or poll (a deadline
     * passed, an NCCL error) fails that collective and gives up every other one in flight: comm.c
     * fails them all with its message and polls none of them again. */
    int max_in_flight;
    dt_status (*issue)(void *ctx, const dt_comm_float_op *f, const dt_comm_deadline *dl, int *issued);
    dt_status (*poll)(void *ctx, int *done);
    /* May be NULL (dt_comm_last_exposed_ms is NAN). Any thread. */
    double (*exposed_ms)(void *ctx);
} dt_comm_backend_ops;
/* Makes the communicator and starts its thread. Takes ownership of `ctx` (freed with
 * be->free, also when this fails). timeout_s (> 0, else DT_ERR_CONFIG): every collective's
 * deadline but a barrier's that has its own. */
dt_status dt_comm_create(dt_comm **out, const dt_comm_backend_ops *be, void *ctx, int rank, int world,
                         double timeout_s);

#endif
