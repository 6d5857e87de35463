/* agree.h — the per-step agreement, the one exchange every step makes outside the gradient
 * all-reduce: after each step's backward and before anyone updates, every rank learns
 *   - the global loss sum and row count (for the log and the loss check),
 *   - whether any rank was asked to stop (then all stop after this same step, with one
 *     checkpoint), and
 *   - whether any rank's device failed (then no rank applies gradients that a failed rank
 *     summed: every rank stops before the update, the failed ones with their own message),
 *   - the sum of the ranks' parts of the gradients' sum of squares (training.zero_stage 1:
 *     each rank holds the reduced gradients of its shard only; the global norm clips them all).
 * One all-gather of five doubles per rank, on the host collective, summed in rank order. */
#ifndef DTRAIN_AGREE_H
#define DTRAIN_AGREE_H

#include "dtrain/comm.h"
#include "dtrain/status.h"

typedef struct dt_agree_vote {
    double loss;      /* in: this rank's loss sum; out: the global sum */
    long rows;        /* in: this rank's rows in the loss; out: the global count (exact below 2^53) */
    int stop;         /* in: this rank was asked to stop; out: some rank was */
    dt_status device; /* in: this rank's device check, with its message set (dt_error_set) when not DT_OK */
    double sumsq;     /* in: this rank's part of the gradients' sum of squares (0 when not sharded); out: the sum
                         (the same bits on every rank) */
} dt_agree_vote;

/* Exchanges the votes of step `step` (1-based, for messages) over `comm` (NULL: one process,
 * nothing to exchange). Returns DT_OK; this rank's own device failure (with its message);
 * DT_ERR_DEVICE "step N: K other rank(s) failed on their GPU in this step; stopping without the
 * update ..." on the ranks whose device was fine; or the collective's own failure. */
dt_status dt_agree_step(dt_comm *comm, long step, dt_agree_vote *v);

#endif
