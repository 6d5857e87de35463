/* launch.h — how workers start: forked by dtrain (dt_launch_run, the supervisor below), or
 * started by someone else (dt_launch_external: torchrun, mpirun, srun, a Kubernetes Indexed
 * Job). Either way each worker runs the same function with its communicator and a
 * dt_launch_ctx, and the collective plan (comm_plan.h) says which collectives it uses.
 *
 * Fork mode: forks one worker process per rank, watches them, and stops all of them when one
 * fails.
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

#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/comm_plan.h"
#include "dtrain/monitor.h"
#include "dtrain/rendezvous.h"
#include "dtrain/status.h"

/* What a worker knows about its launch. */
typedef struct dt_launch_ctx {
    int attempt;              /* 0 for the first start, k after the k-th restart */
    const volatile int *stop; /* becomes non-zero when the launcher is asked to stop (preemption) */
    char *note;               /* a line for the launcher to print after a clean stop (rank 0) */
    size_t note_size;
    const dt_worker_slot *stats; /* (world) each worker's CPU, memory and GPU, sampled by the launcher; NULL externally */
    dt_worker_slot *own_stats; /* this worker's slot (where it names its GPU); NULL externally */
    /* cores other processes kept busy, as the launcher last measured them, and its round (0:
     * not yet); NULL externally */
    const _Atomic uint32_t *foreign_mcores; /* x 1000 */
    const _Atomic uint32_t *foreign_round;
    volatile int *waiting;    /* set while this worker waits on another's disk (not idle); may be NULL */
    int local_rank;           /* this worker's index among the workers on its host (its device there) */
    const char *launched_by;  /* external launch: who started it and how the ranks met, for the log; else NULL */
    const dt_comm_plan *plan; /* the collectives: `comm` is plan->host's; plan->device_comm for device buffers */
    dt_comm *grad_comm;       /* a hierarchical plan's collective for gradients and weights (comm.h
                                 dt_comm_init_hier); NULL: `comm` (or the device collective) carries them */
    /* model parallelism (dt_launch_cfg tp or pp > 1, comm_plan.h dt_mesh): this rank's
     * tensor-parallel group's collective (NULL with tp 1), and its data-parallel group's (NULL
     * with one replica); else both NULL */
    dt_comm *tp_comm, *dp_comm;
    /* pipeline parallelism (pp > 1): collectives of two ranks, the stage before's and this one
     * (rank 0 the stage before: NULL on the first stage), this one and the stage after's (NULL
     * on the last), and the first and last stages' (rank 0 the first; NULL on the others) */
    dt_comm *pp_prev, *pp_next, *pp_ends;
} dt_launch_ctx;

/* The worker body: runs in the child process for `rank`. Its status (and dt_error_msg) is
 * reported to the supervisor; the child then exits with dt_status_exit_code(status). */
typedef dt_status (*dt_launch_fn)(void *arg, dt_comm *comm, const dt_launch_ctx *ctx);

typedef struct dt_launch_cfg {
    int world;              /* workers to fork, 1..DT_MAX_WORLD */
    const dt_comm_plan *plan; /* decided for launcher DT_LAUNCHER_FORK: its host collective is shm */
    double timeout_s;       /* collective deadline */
    const char *log_dir;    /* rank-N.log are written here (must exist); NULL: no logs */
    const char *what;       /* for messages: "training", "doctor" */
    int max_restarts;       /* restarts of all workers after a failure (0: none) */
    double backoff_s;       /* wait before restart k: backoff_s * 2^(k-1), at most DT_LAUNCH_BACKOFF_MAX_S */
    int clean_stop;         /* 1: the first SIGINT/SIGTERM asks the workers to stop cleanly (training);
                               0: signals stop them at once (doctor) */
    double monitor_every_s; /* sample each worker's CPU and memory this often (0: 2 s) */
    int tp, pp;             /* training.tensor_parallel and pipeline_parallel (0 or 1: none): the groups'
                               collectives are made with the job's (dt_launch_ctx tp_comm, dp_comm) */
} dt_launch_cfg;

#define DT_LAUNCH_BACKOFF_MAX_S 60.0

typedef struct dt_launch_result {
    int restarts;           /* restarts that happened */
    int stopped_by;         /* the signal of a clean stop (preemption), else 0 */
    char note[1024];        /* rank 0's note of a clean stop */
    int mpi;                /* external launch: MPI was initialised (dt_launch_finish ends it) */
    int mpi_agreed;         /* ... and every rank knows of the failure: MPI may finish cleanly */
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


/* ---- workers started by someone else ----
 * This process is one worker (rank env->rank of env->world). It decides the collective plan
 * (refusals: DT_ERR_CONFIG), meets the other ranks (MPI, or the TCP rendezvous of
 * rendezvous.h, where rank 0 completes the plan with the hosts it sees), then runs fn once.
 * Restarts are the launcher's (a rerun resumes): ctx->attempt is its restart count
 * (TORCHELASTIC_RESTART_COUNT, SLURM_RESTART_COUNT). The first SIGINT/SIGTERM sets *ctx->stop
 * (finish the step, checkpoint, DT_OK with res->stopped_by); a second one kills. A failure of
 * fn aborts the shared world at once (the others fail now, not at their deadline) and is
 * prefixed "rank N". The process must end with dt_launch_finish. */
typedef struct dt_launch_ext_cfg {
    const dt_ext_env *env;    /* dt_ext_env_detect's */
    dt_comm_plan_in plan;     /* dt_launch_plan_in's: the host layout is found on the way */
    uint32_t digest;          /* of the config: every rank must run the same */
    double timeout_s;         /* the collective deadline, and the rendezvous' */
    dt_status (*before_ok)(void *user); /* may be NULL: rank 0, once every rank has checked in (the run directory) */
    void *user;
    int tp, pp;               /* as dt_launch_cfg's: the model-parallel groups (every rank on one host for now) */
} dt_launch_ext_cfg;

dt_status dt_launch_external(const dt_launch_ext_cfg *cfg, dt_launch_fn fn, void *arg, dt_launch_result *res);

/* The last call of a process that ran dt_launch_external, with its exit code: finishes MPI when
 * it was used (MPI_Abort after a failure not every rank knows of, so that the job ends). */
void dt_launch_finish(const dt_launch_result *res, int exit_code);

/* The collective plan's inputs for a job of `world` workers (as configured) started by `env`
 * (NULL: dtrain forks them on this host) on a backend named `device` whose device collective
 * is `device_comm` (NULL: none). Everything but the hosts the rendezvous sees. */
void dt_launch_plan_in(dt_comm_kind requested, const char *source, const dt_ext_env *env, int world,
                       const char *device, const char *device_comm, dt_comm_plan_in *out);

#endif
