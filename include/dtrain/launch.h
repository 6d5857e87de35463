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
 * signal or exit status and the log file to read. SIGINT/SIGTERM to the launcher are
 * forwarded to the workers the same way. No CUDA or NCCL call happens in the launcher. */
#ifndef DTRAIN_LAUNCH_H
#define DTRAIN_LAUNCH_H

#include "dtrain/comm.h"
#include "dtrain/status.h"

/* The worker body: runs in the child process for `rank`. Its status (and dt_error_msg) is
 * reported to the supervisor; the child then exits with dt_status_exit_code(status). */
typedef dt_status (*dt_launch_fn)(void *arg, dt_comm *comm);

typedef struct dt_launch_cfg {
    int world;              /* workers to fork, 1..64 */
    double timeout_s;       /* collective deadline */
    const char *log_dir;    /* rank-N.log are written here (must exist); NULL: no logs */
    const char *what;       /* for messages: "training", "doctor" */
} dt_launch_cfg;

/* Forks, supervises and reaps `world` workers running fn(arg, comm). DT_OK when every
 * worker exited 0. Otherwise the first failure: DT_ERR_CONFIG/DT_ERR_DATA-class when the
 * worker exited 2 (its message, prefixed "rank N: "), DT_ERR_INTERNAL otherwise with
 * "rank N was killed by SIGKILL (log: DIR/rank-N.log)" or the worker's message.
 * DT_ERR_INTERRUPTED when the launcher itself got SIGINT/SIGTERM. */
dt_status dt_launch_run(const dt_launch_cfg *cfg, dt_launch_fn fn, void *arg);

#endif
