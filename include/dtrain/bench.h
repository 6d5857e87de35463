/* bench.h — `dtrain bench`: the same config at several worker counts (same per-worker
 * batch), one real training run each, and a table of how it scales.
 *
 * Each run goes into RUN_DIR/bench/wN (emptied first; checkpoint only at the end) and
 * is measured from its own metrics.jsonl "summary" line: train time, eval time, samples/s,
 * tokens/s and the share of step time spent waiting for all-reduces. Speedup and scaling
 * efficiency are against the smallest worker count (normally 1): speedup = tokens/s over
 * that run's tokens/s, efficiency = speedup * (smallest count / N). Writes
 * RUN_DIR/bench/bench.csv and RUN_DIR/bench/bench.svg (throughput and efficiency against
 * workers) and prints the table. */
#ifndef DTRAIN_BENCH_H
#define DTRAIN_BENCH_H

#include <stdio.h>

#include "dtrain/config.h"
#include "dtrain/status.h"

#define DT_BENCH_MAX_RUNS 16

typedef struct dt_bench_row {
    int workers;
    long steps;
    double train_s, eval_s, samples_per_s, tokens_per_s, comm_share;
    double speedup, efficiency;
} dt_bench_row;

/* Parses "1,2,4" (1..64 each, no repeats) into workers[], *n of them. DT_ERR_USAGE. */
dt_status dt_bench_parse_workers(const char *list, int *workers, int *n);

/* Runs the sweep; steps > 0 overrides training.max_steps. Prints progress and the table on
 * `out`. rows (may be NULL) receives the DT_BENCH_MAX_RUNS results. */
dt_status dt_bench_run(const dt_config *cfg, const int *workers, int n, long steps, FILE *out, dt_bench_row *rows);

#endif
