/* test_agree.c — the per-step agreement (src/comm/agree.c) between real worker processes (the
 * fork launcher and the shm collective): sums, a stop asked of one rank reaching all, a device
 * failure on one rank stopping every rank before the update (the failed one with its own
 * message, the others naming how many failed), and one process alone. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "dtrain/agree.h"
#include "dtrain/comm_plan.h"
#include "dtrain/launch.h"

enum { SUMS, STOP, DEVICE };

/* rank r votes loss r + 0.5, rows 10 r + 1; in STOP rank 1 was asked to stop; in DEVICE
 * rank 2's device failed */
static dt_status voter(void *arg, dt_comm *comm, const dt_launch_ctx *ctx) {
    (void)ctx;
    const int scenario = *(const int *)arg, rank = dt_comm_rank(comm), world = dt_comm_world(comm);
    dt_agree_vote v = {.loss = rank + 0.5, .rows = 10 * rank + 1, .stop = scenario == STOP && rank == 1,
                       .sumsq = 1.0 + rank * 1e-12};
    if (scenario == DEVICE && rank == 2) v.device = dt_error_set(DT_ERR_DEVICE, "rank 2: out of GPU memory in backward");
    dt_status st = dt_agree_step(comm, 7, &v);
    double loss = 0, sumsq = 0;
    long rows = 0;
    for (int r = 0; r < world; r++) {
        loss += r + 0.5;
        rows += 10 * r + 1;
        sumsq += 1.0 + r * 1e-12; /* in rank order, in double: a float exchange would lose the 1e-12s */
    }
    if (scenario == DEVICE) {
        const char *want = rank == 2 ? "rank 2: out of GPU memory in backward"
                                     : "step 7: 1 other rank(s) failed on their GPU in this step; stopping without the "
                                       "update (their messages say why)";
        if (st != DT_ERR_DEVICE || strcmp(dt_error_msg(), want) != 0)
            return dt_error_set(DT_ERR_INTERNAL, "rank %d: got status %d, \"%s\"; want \"%s\"", rank, st, dt_error_msg(),
                                want);
        return DT_OK;
    }
    if (st != DT_OK) return st;
    if (v.loss != loss || v.rows != rows || v.stop != (scenario == STOP) || v.sumsq != sumsq)
        return dt_error_set(DT_ERR_INTERNAL, "rank %d: agreed loss %g rows %ld stop %d sumsq %.17g; want %g %ld %d %.17g",
                            rank, v.loss, v.rows, v.stop, v.sumsq, loss, rows, scenario == STOP, sumsq);
    return DT_OK;
}

static void run_scenario(int scenario, int world) {
    dt_comm_plan_in in;
    dt_comm_plan plan;
    dt_launch_plan_in(DT_COMM_AUTO, NULL, NULL, world, "cpu", NULL, &in);
    CHECK_OK(dt_comm_plan_decide(&in, &plan));
    dt_launch_cfg lc = {.world = world, .plan = &plan, .timeout_s = 30, .what = "agree test"};
    CHECK_OK(dt_launch_run(&lc, voter, &scenario, NULL));
}

int main(void) {
    run_scenario(SUMS, 3);
    run_scenario(STOP, 3);
    run_scenario(DEVICE, 4);
    run_scenario(SUMS, 1);
    /* one process: nothing to exchange, the values as they are (no float rounding) */
    dt_agree_vote v = {.loss = 0.1, .rows = 3, .stop = 1};
    CHECK_OK(dt_agree_step(NULL, 1, &v));
    CHECK(v.loss == 0.1 && v.rows == 3 && v.stop == 1);
    v.device = dt_error_set(DT_ERR_DEVICE, "kernel fault");
    CHECK_INT_EQ(dt_agree_step(NULL, 1, &v), DT_ERR_DEVICE);
    CHECK_STR_EQ(dt_error_msg(), "kernel fault");
    TEST_PASS("test_agree");
}
