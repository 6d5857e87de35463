/* worker.h — the training loop: the only place that knows the order of things
 * (data -> forward -> backward -> clip -> AdamW -> log / eval / save). */
#ifndef DTRAIN_WORKER_H
#define DTRAIN_WORKER_H

#include "dtrain/comm.h"
#include "dtrain/comm_plan.h"
#include "dtrain/config.h"
#include "dtrain/launch.h"
#include "dtrain/metrics.h"
#include "dtrain/monitor.h"
#include "dtrain/status.h"

typedef struct dt_worker_opts {
    int quiet;     /* --quiet */
    int progress;  /* -1 auto, 0 never, 1 always */
    /* may be NULL (one process, no launcher): how this worker was started (launch.h): its
     * attempt (resume from this run's last checkpoint after a restart), the stop flag, the
     * note of a clean stop, the launcher's samples, its local rank (its GPU), the plan */
    const dt_launch_ctx *launch;
} dt_worker_opts;

/* Creates cfg->run.dir (once, before the workers start). With checkpoint.resume: never, moves
 * earlier checkpoints aside (see dt_ckpt_set_aside) and says so on stdout. The resolved
 * config.yaml is written by rank 0 once it has accepted the resume point (a refused run leaves
 * the one of the weights there). */
dt_status dt_worker_prepare_run_dir(const dt_config *cfg);

/* Trains as configured, as rank dt_comm_rank(comm) of dt_comm_world(comm) (comm NULL: a
 * single process). Rank 0 writes train.log, metrics.jsonl, checkpoints and
 * model.safetensors into cfg->run.dir; every rank writes rank-N.log.
 *
 * Resume (checkpoint.resume, or always after a restart): continues from the newest valid
 * checkpoint at its step, epoch and sample cursor, on any number of workers. Checkpoints
 * every checkpoint.every_steps and at the end. SIGINT/SIGTERM to the worker, or *opts->stop,
 * make every rank stop after the same step with a checkpoint and return DT_OK. */
dt_status dt_worker_train(const dt_config *cfg, const dt_worker_opts *opts, dt_comm *comm);

/* Trains as configured with training.num_workers worker processes that dtrain forks on this
 * host (launch.h: restarts, clean stop, monitoring): resolves the device and the collective
 * plan (refusals are DT_ERR_CONFIG, before anything is written), checks there is a device per
 * worker, prepares the run directory, launches. `opts` supplies quiet/progress. *res (may be
 * NULL) receives the launch result. */
dt_status dt_worker_launch(const dt_config *cfg, const dt_worker_opts *opts, dt_launch_result *res);

/* Trains as rank env->rank of a job started by someone else (launch.h dt_launch_external):
 * the world size is the launcher's (training.num_workers is ignored, with a note), the
 * threads per worker this host's share; rank 0 prepares the run directory once every rank
 * has checked in. `opts` supplies quiet/progress. The process must end with dt_launch_finish. */
dt_status dt_worker_launch_external(const dt_config *cfg, const dt_ext_env *env, const dt_worker_opts *opts,
                                    dt_launch_result *res);

/* Evaluates `weights` (a safetensors file) on data.val_path and prints the result line;
 * *out receives it (step 0). */
dt_status dt_worker_eval(const dt_config *cfg, const char *weights, dt_eval_point *out);

/* Prints the resolved config followed by the model size, for --dry-run; then opens and checks
 * the data as the run would (labels, token range, sizes) and prints its size: a data error
 * the run would refuse is returned (after the config and the model size are printed). */
dt_status dt_worker_describe(const dt_config *cfg, FILE *out);

#endif
