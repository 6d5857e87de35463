/* agree.c — the per-step agreement (include/dtrain/agree.h). */
#include "dtrain/agree.h"

#include <stdio.h>

dt_status dt_agree_step(dt_comm *comm, long step, dt_agree_vote *v) {
    char dev_msg[1024] = ""; /* this rank's device failure: kept across the exchange */
    if (v->device != DT_OK) snprintf(dev_msg, sizeof dev_msg, "%s", dt_error_msg());
    if (comm && dt_comm_world(comm) > 1) {
        float sums[4] = {(float)v->loss, (float)v->rows, (float)v->stop, (float)(v->device != DT_OK)};
        DT_TRY(dt_comm_allreduce(comm, sums, 4, DT_REDUCE_SUM));
        v->loss = sums[0];
        v->rows = (long)sums[1];
        v->stop = sums[2] > 0;
        if (v->device == DT_OK && sums[3] > 0)
            return dt_error_set(DT_ERR_DEVICE, "step %ld: %.0f other rank(s) failed on their GPU in this step; stopping "
                                "without the update (their messages say why)", step, sums[3]);
    }
    return v->device == DT_OK ? DT_OK : dt_error_set(v->device, "%s", dev_msg);
}
