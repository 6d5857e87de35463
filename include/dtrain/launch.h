/* launch.h — the launcher/supervisor: forks one worker process per rank, watches them, and
 * stops all of them when one fails.
 *
 * Before fork it makes the shared-memory world of the `shm` collective (an anonymous shared
 * mapping: nothing is ever left in /dev/shm) and a status block where each worker leaves
 * its error message. Each worker: knows its rank and world size, dies with its parent
 * (PR_SET_PDEATHSIG), is named "dtrain-rN" in ps, writes its own log `rank-N.log` (rank 0
 * keeps the console; the other ranks' stdout/stderr go to their log), joins the
 * collective and runs the worker function.
 *
 * The supervisor notices a dead worker within 50 ms: it aborts the collective (waiting
 * ranks fail at once), sends SIGTERM (and SIGCONT, for stopped ones) to the others, SIGKILL
 * after a grace period, reaps every child, and returns one message naming the rank, the
 * signal or exit status and the log file to read; then it may restart all of them
 * (fault_tolerance). SIGINT/SIGTERM to the launcher ask the workers to stop cleanly
 * (preemption). No CUDA or NCCL call happens in the launcher. */
#ifndef DTRAIN_LAUNCH_H
#define DTRAIN_LAUNCH_H

#include "dtrain/comm.h"
#include "dtrain/monitor.h"
#include "dtrain/status.h"

/* What a worker knows about its launch. */
typedef struct dt_launch_ctx {
    int attempt;              /* 0 for the first start, k after the k-th restart */
    const volatile int *stop; /* becomes non-zero when the launcher is asked to stop (preemption) */
    char *note;               /* a line for the launcher to print after a clean stop (rank 0) */
    size_t note_size;
    const dt_worker_slot *stats; /* (world) each worker's CPU and memory, sampled by the launcher */
    volatile int *waiting;    /* set while this worker waits on another's disk (not idle) */
} dt_launch_ctx;

/* The worker body: runs in the child process for `rank`. Its status (and dt_error_msg) is
 * reported to the supervisor; the child then exits with dt_status_exit_code(status). */
typedef dt_status (*dt_launch_fn)(void *arg, dt_comm *comm, const dt_launch_ctx *ctx);

typedef struct dt_launch_cfg {
    int world;              /* workers to fork, 1..64 */
    double timeout_s;       /* collective deadline */
    const char *log_dir;    /* rank-N.log are written here (must exist); NULL: no logs */
    const char *what;       /* for messages: "training", "doctor" */
    int max_restarts;       /* restarts of all workers after a failure (0: none) */
    double backoff_s;       /* wait before restart k: backoff_s * 2^(k-1), at most DT_LAUNCH_BACKOFF_MAX_S */
    int clean_stop;         /* 1: the first SIGINT/SIGTERM asks the workers to stop cleanly (training);
                               0: signals stop them at once (doctor) */
    double monitor_every_s; /* sample each worker's CPU and memory this often (0: 2 s) */
} dt_launch_cfg;

#define DT_LAUNCH_BACKOFF_MAX_S 60.0

typedef struct dt_launch_result {
    int restarts;           /* restarts that happened */
    int stopped_by;         /* the signal of a clean stop (preemption), else 0 */
    char note[1024];        /* rank 0's note of a clean stop */
} dt_launch_result;

/* Forks, supervises and reaps `world` workers running fn(arg, comm, ctx).
 *
 * Failure: a worker that dies or exits non-zero stops the attempt. An exit status of 2
 * (bad config or data) is final; any other failure restarts every worker (ctx->attempt + 1)
 * after the backoff, up to max_restarts times, printing (stderr and log_dir/train.log) the
 * cause of each failed attempt. The result is the first failure of the last attempt:
 * DT_ERR_CONFIG-class when the worker exited 2 (its message, prefixed "rank N: "),
 * DT_ERR_INTERNAL otherwise with "rank N was killed by SIGKILL (log: DIR/rank-N.log)" or the
 * worker's message.
 *
 * Preemption (clean_stop): the first SIGINT/SIGTERM to the launcher or to a worker sets
 * *ctx->stop in every worker, which finish their step, checkpoint and exit 0: DT_OK with
 * res->stopped_by set and rank 0's note. A worker failing meanwhile stops all at once with its
 * cause (no restart). If they have not exited after timeout_s + 30 s, or on a second signal,
 * they are killed at once: DT_ERR_INTERRUPTED. A signal while waiting to restart is a clean
 * stop too. `res` may be NULL. */
dt_status dt_launch_run(const dt_launch_cfg *cfg, dt_launch_fn fn, void *arg, dt_launch_result *res);

#endif
