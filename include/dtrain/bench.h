/* bench.h — `dtrain bench`: the same config at several worker counts (same per-worker
 * batch), one real training run each, and a table of how it scales.
 *
 * Each run goes into RUN_DIR/bench/wN (emptied first; checkpoint only at the end) and
 * is measured from its own metrics.jsonl "summary" line: train time, eval time, samples/s,
 * tokens/s and the share of step time spent waiting for all-reduces. With --repeat K each
 * count runs K times (RUN_DIR/bench/wN-rK), interleaved, and the table shows medians and the
 * slowest and fastest run. Speedup and scaling efficiency are against the smallest worker
 * count (normally 1): speedup = median tokens/s over that count's, efficiency = speedup *
 * (smallest count / N). A verdict follows the table (dt_bench_verdict). Writes
 * RUN_DIR/bench/bench.csv and RUN_DIR/bench/bench.svg (throughput and efficiency against
 * workers) and prints the table.
 *
 * With --layouts the runs are layouts of the workers instead (D x P x T: data-parallel replicas,
 * pipeline stages, tensor-parallel shares), in the order given, each at the first layout's
 * global batch (data.batch_size_per_worker x its replicas, split over each one's); the table compares each with the first (step time, tokens/s, the share of the step
 * spent in collectives, bytes sent and the largest rank's memory while training), bench.csv holds it
 * and no bench.svg is drawn. */
#ifndef DTRAIN_BENCH_H
#define DTRAIN_BENCH_H

#include <stdio.h>

#include "dtrain/config.h"
#include "dtrain/status.h"

#define DT_BENCH_MAX_RUNS 16
#define DT_BENCH_MAX_REPEAT 20

/* what a row's numbers are worth (dt_bench_verdict) */
enum {
    DT_BENCH_NOISY = 1,       /* its repeats differ by more than 15% (or the machine was busy) */
    DT_BENCH_SUPERLINEAR = 2, /* efficiency above 110% (past what noise gives): not a real result with the
                                 same batch per worker */
    DT_BENCH_LOW = 4,         /* efficiency under 50%: explained */
};

typedef struct dt_bench_row {
    int workers, runs;
    int tp;                        /* training.tensor_parallel of the run */
    int pp, micro;                 /* training.pipeline_parallel and the micro-batches a step (grad_accum_steps) */
    double bubble;                 /* pipeline stages: 1F1B's idle share of a step, (P - 1) / (M + P - 1); else 0 */
    char layout[32];               /* --layouts: "d2t2"; else "" */
    double rss_mb;                 /* the largest rank's resident memory while it trained (the median of the
                                      launcher's samples; median over the runs); 0: no samples */
    long steps;
    /* medians over the runs */
    double train_s, eval_s, samples_per_s, tokens_per_s, comm_share;
    double tokens_min, tokens_max; /* tokens/s of the slowest and the fastest run */
    double sent_bytes;             /* what each worker sent per step (rank 0's, dt_comm_bytes_sent; the
                                      same for every run of a count) */
    double speedup, efficiency;    /* from the medians */
    int flags;                     /* DT_BENCH_* */
} dt_bench_row;

/* A layout of the workers (--layouts): D data-parallel replicas x P pipeline stages x T
 * tensor-parallel shares (comm_plan.h dt_mesh) */
typedef struct dt_bench_layout {
    int dp, pp, tp;
} dt_bench_layout;

typedef struct dt_bench_opts {
    const int *workers; /* worker counts */
    int n;
    const dt_bench_layout *layouts; /* or, when n_layouts > 0, these layouts in this order (workers unused) */
    int n_layouts;
    long steps;         /* > 0: overrides training.max_steps */
    int repeat;         /* runs per count (1..DT_BENCH_MAX_REPEAT), interleaved: 1,2,4,1,2,4,... */
} dt_bench_opts;

/* What the verdict knows of the machine and the runs besides the rows. */
typedef struct dt_bench_env {
    int cpu;             /* CPU workers (they share the machine's cores) */
    int cores;           /* usable cores */
    int threads_fixed;   /* training.cpu_threads_per_worker (0: cores / workers) */
    double busy_before;  /* cores busy (other processes) in the half second before the first run; < 0: unknown */
    long tokens_per_worker_step; /* batch_size_per_worker x seq_len x grad_accum_steps */
    int layouts;         /* the rows are layouts of the same workers: no scaling efficiency to judge */
} dt_bench_env;

/* Parses "1,2,4" (1..64 each, no repeats) into workers[], *n of them. DT_ERR_USAGE. */
dt_status dt_bench_parse_workers(const char *list, int *workers, int *n);

/* Parses "d4,d2t2,t4" (each: d, p, t followed by a count, each letter at most once, 1 when
 * left out; at most DT_BENCH_MAX_RUNS layouts of at most DT_MAX_WORLD workers) into out[], *n
 * of them. DT_ERR_USAGE. */
dt_status dt_bench_parse_layouts(const char *list, dt_bench_layout *out, int *n);

/* Runs the sweep. Prints progress, the table and the verdict on `out`. rows (may be NULL)
 * receives the DT_BENCH_MAX_RUNS results. */
dt_status dt_bench_run(const dt_config *cfg, const dt_bench_opts *opts, FILE *out, dt_bench_row *rows);

/* Flags the rows (speedup and efficiency already computed) and writes what they mean into
 * buf, one line each (empty when there is nothing to say): too noisy to compare, efficiency
 * above 100% flagged as not a result, efficiency under 50% explained (communication share,
 * CPU workers sharing the cores, steps too small for the worker count). */
void dt_bench_verdict(dt_bench_row *rows, int n, const dt_bench_env *env, char *buf, size_t size);

#endif
