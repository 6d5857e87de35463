/* agree.c — the per-step agreement (include/dtrain/agree.h). */
#include "dtrain/agree.h"

#include <stdio.h>

dt_status dt_agree_step(dt_comm *comm, long step, dt_agree_vote *v) {
    char dev_msg[1024] = ""; /* this rank's device failure: kept across the exchange */
    if (v->device != DT_OK) snprintf(dev_msg, sizeof dev_msg, "%s", dt_error_msg());
    const int world = comm ? dt_comm_world(comm) : 1;
    if (world > 1) {
        /* every rank's vote to every rank, summed in rank order in double: exact for the counts,
         * and the same bits on every rank */
        enum { LOSS, ROWS, STOP, FAILED, SUMSQ, N_FIELDS };
        double mine[N_FIELDS] = {v->loss, (double)v->rows, v->stop, v->device != DT_OK, v->sumsq};
        double all[DT_MAX_WORLD][N_FIELDS], sum[N_FIELDS] = {0};
        DT_TRY(dt_comm_allgather(comm, mine, sizeof mine, all));
        for (int r = 0; r < world; r++)
            for (int f = 0; f < N_FIELDS; f++) sum[f] += all[r][f];
        v->loss = sum[LOSS];
        v->rows = (long)sum[ROWS];
        v->stop = sum[STOP] > 0;
        v->sumsq = sum[SUMSQ];
        if (v->device == DT_OK && sum[FAILED] > 0)
            return dt_error_set(DT_ERR_DEVICE, "step %ld: %.0f other rank(s) failed on their GPU in this step; stopping "
                                "without the update (their messages say why)", step, sum[FAILED]);
    }
    return v->device == DT_OK ? DT_OK : dt_error_set(v->device, "%s", dev_msg);
}
