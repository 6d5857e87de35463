/* test_monitoring.c — what a run shows its user, through the real binary:
 *   - metrics.jsonl: every line is JSON with the documented fields (train, eval, workers,
 *     summary), the worker samples name both ranks;
 *   - the TensorBoard event file read back by the real `tensorboard` package
 *     (tests/tb_read.py, run with build/venv/bin/python; scripts/test.sh installs it);
 *   - plain output (not a terminal) has no control characters; on a pseudo-terminal the
 *     progress bar with its ETA is drawn;
 *   - the end-of-run summary; `dtrain bench` with 1,2 workers: table, CSV, SVG;
 *   - --version names every library with the version it was built with;
 *   - units: CRC32C, /proc sampling, the idle call-out. */
#include <jansson.h>
#include <math.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dtrain/bench.h"
#include "dtrain/metrics.h"
#include "dtrain/monitor.h"
#include "dtrain/tboard.h"
#include "proc.h"
#include "testutil.h"

/* "2026-12-01T18:20:01.123Z" at the start of s: the stamp of log lines and records */
static int is_stamp(const char *s) {
    const char *pat = "dddd-dd-ddTdd:dd:dd.dddZ";
    for (int i = 0; pat[i]; i++)
        if (pat[i] == 'd' ? !(s[i] >= '0' && s[i] <= '9') : s[i] != pat[i]) return 0;
    return 1;
}

static char out_text[1 << 20];

static void slurp_out(const char *tag) { slurp_stdout(tag, out_text, sizeof out_text); }

static void check_fields(json_t *o, const char *const *fields) {
    for (int i = 0; fields[i]; i++) {
        if (!json_object_get(o, fields[i])) {
            char *s = json_dumps(o, 0);
            printf("missing field \"%s\" in %s\n", fields[i], s);
            free(s);
            CHECK(0);
        }
    }
}

static void test_run_outputs(void) {
    char rd[1400];
    snprintf(rd, sizeof rd, "run.dir=%s/run", test_dir());
    const char *args[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", "training.num_workers=2",
                          "--set", "data.batch_size_per_worker=4", "--set", "training.max_steps=1200",
                          "--set", "logging.monitor_every_s=0.25", "--set", "checkpoint.every_steps=600", NULL};
    CHECK_INT_EQ(run_sync("run", args), 0);
    slurp_out("run");

    /* plain output: lines only, no escape sequences or carriage returns */
    for (const char *p = out_text; *p; p++)
        if ((unsigned char)*p < 0x20 && *p != '\n') {
            printf("control character 0x%02x at offset %ld\n", *p, (long)(p - out_text));
            CHECK(0);
        }
    CHECK_STR_CONTAINS(out_text, "done: 1200 steps | train ");
    CHECK_STR_CONTAINS(out_text, "per worker: ");
    CHECK_STR_CONTAINS(out_text, "waiting for all-reduce: ");
    CHECK_STR_CONTAINS(out_text, " of step time, "); /* then its ms per step */
    CHECK_STR_CONTAINS(out_text, " ms per step | sent ");
    CHECK_STR_CONTAINS(out_text, "peak memory: rank 0 ");
    CHECK_STR_CONTAINS(out_text, ", rank 1 ");
    CHECK_STR_CONTAINS(out_text, "checkpoints written: 2");

    /* metrics.jsonl */
    static const char *const train_f[] = {"type", "step", "epoch", "loss", "lr", "grad_norm", "step_ms", "tokens_per_s",
                                          "comm_ms", NULL};
    static const char *const eval_f[] = {"type", "step", "val_loss", "val_accuracy", "val_examples", "eval_ms", NULL};
    static const char *const worker_f[] = {"rank", "pid", "cpu_pct", "rss_mb", "peak_rss_mb", NULL};
    static const char *const summary_f[] = {"type", "steps", "train_s", "eval_s", "samples", "tokens", "samples_per_s",
                                            "tokens_per_s", "workers", "comm_s", "comm_share", "val_loss",
                                            "val_accuracy", "peak_rss_mb", "checkpoints", "comm_ms_per_step", NULL};
    char path[1300], line[1 << 14];
    snprintf(path, sizeof path, "%s/run/metrics.jsonl", test_dir());
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    int n_train = 0, n_eval = 0, n_workers = 0, n_summary = 0;
    char last_time[32] = "";
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        if (!o) printf("not JSON: %s (%s)\n", line, err.text);
        CHECK(o != NULL);
        const char *type = json_string_value(json_object_get(o, "type"));
        CHECK(type != NULL);
        CHECK(n_summary == 0); /* the summary is the last line */
        /* every record says when it was written, in order */
        const char *when = json_string_value(json_object_get(o, "time"));
        CHECK(when != NULL && is_stamp(when) && strlen(when) == 24);
        CHECK(strcmp(when, last_time) >= 0);
        snprintf(last_time, sizeof last_time, "%s", when);
        if (strcmp(type, "train") == 0) {
            check_fields(o, train_f);
            CHECK_INT_EQ(json_integer_value(json_object_get(o, "step")), ++n_train);
            CHECK(json_number_value(json_object_get(o, "comm_ms")) >= 0);
            CHECK(json_object_get(o, "fwd_ms") == NULL); /* logging.phase_times is off */
        } else if (strcmp(type, "eval") == 0) {
            check_fields(o, eval_f);
            n_eval++;
        } else if (strcmp(type, "workers") == 0) {
            json_t *ws = json_object_get(o, "workers");
            CHECK_INT_EQ(json_array_size(ws), 2);
            for (size_t i = 0; i < 2; i++) {
                json_t *w = json_array_get(ws, i);
                check_fields(w, worker_f);
                CHECK_INT_EQ(json_integer_value(json_object_get(w, "rank")), (long long)i);
                CHECK(json_number_value(json_object_get(w, "rss_mb")) > 1.0);
                double cpu = json_number_value(json_object_get(w, "cpu_pct"));
                CHECK(cpu >= 0 && cpu < 100.0 * 64);
            }
            n_workers++;
        } else if (strcmp(type, "summary") == 0) {
            check_fields(o, summary_f);
            CHECK_INT_EQ(json_integer_value(json_object_get(o, "steps")), 1200);
            CHECK_INT_EQ(json_integer_value(json_object_get(o, "workers")), 2);
            CHECK_INT_EQ(json_integer_value(json_object_get(o, "samples")), 1200 * 8);
            CHECK_INT_EQ(json_integer_value(json_object_get(o, "checkpoints")), 2);
            CHECK_INT_EQ(json_array_size(json_object_get(o, "peak_rss_mb")), 2);
            double share = json_number_value(json_object_get(o, "comm_share"));
            CHECK(share > 0 && share < 1);
            /* the exposed communication per step: comm_s over the steps, in ms */
            const double per_step = json_number_value(json_object_get(o, "comm_ms_per_step"));
            const double comm_s = json_number_value(json_object_get(o, "comm_s"));
            CHECK(per_step > 0 && fabs(per_step - 1e3 * comm_s / 1200) <= 1e-6 * per_step);
            n_summary++;
        } else {
            printf("unknown record type %s\n", type);
            CHECK(0);
        }
        json_decref(o);
    }
    fclose(f);
    printf("metrics.jsonl: %d train, %d eval, %d workers, %d summary records\n", n_train, n_eval, n_workers, n_summary);
    CHECK_INT_EQ(n_train, 1200);
    CHECK(n_eval >= 100);
    CHECK(n_workers >= 1);
    CHECK_INT_EQ(n_summary, 1);
    /* every line of train.log and of a worker's log starts with the time it was written */
    const char *logs[] = {"train.log", "rank-0.log", "rank-1.log"};
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/run/%s", test_dir(), logs[i]);
        f = fopen(path, "r");
        CHECK(f != NULL);
        int lines = 0;
        while (fgets(line, sizeof line, f)) {
            if (!is_stamp(line) || line[24] != ' ') printf("%s: a line without a time: %s", logs[i], line);
            CHECK(is_stamp(line) && line[24] == ' ');
            lines++;
        }
        fclose(f);
        CHECK(lines > 2);
    }

    /* TensorBoard's own reader */
    if (access(DTRAIN_TEST_PYTHON, X_OK) != 0) {
        printf("%s is missing: scripts/test.sh installs tensorboard there (python3 -m venv build/venv && "
               "build/venv/bin/pip install tensorboard)\n", DTRAIN_TEST_PYTHON);
        CHECK(0);
    }
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s/tests/tb_read.py %s/run", DTRAIN_TEST_PYTHON, DTRAIN_SOURCE_DIR, test_dir());
    CHECK_INT_EQ(system(cmd), 0);
}

/* logging.phase_times: each train record says how long forward, backward and the optimizer
 * took, within the step */
static void test_phase_times(void) {
    char rd[1400];
    snprintf(rd, sizeof rd, "run.dir=%s/phases", test_dir());
    const char *args[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", "logging.phase_times=true", "--quiet",
                          NULL};
    CHECK_INT_EQ(run_sync("phases", args), 0);
    char path[1300], line[1 << 14];
    snprintf(path, sizeof path, "%s/phases/metrics.jsonl", test_dir());
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        CHECK(o != NULL);
        if (strcmp(json_string_value(json_object_get(o, "type")), "train") == 0) {
            const double fw = json_number_value(json_object_get(o, "fwd_ms")),
                         bw = json_number_value(json_object_get(o, "bwd_ms")),
                         op = json_number_value(json_object_get(o, "opt_ms")),
                         st = json_number_value(json_object_get(o, "step_ms"));
            CHECK(fw > 0 && bw > 0 && op > 0 && fw + bw + op <= st * 1.001 + 1e-3);
            n++;
        }
        json_decref(o);
    }
    if (f) fclose(f);
    CHECK_INT_EQ(n, 20);
}

static void test_tty_bar(void) {
    char rd[1400];
    snprintf(rd, sizeof rd, "run.dir=%s/tty", test_dir());
    int master;
    pid_t pid = forkpty(&master, NULL, NULL, NULL);
    CHECK(pid >= 0);
    if (pid == 0) {
        if (chdir(DTRAIN_SOURCE_DIR) != 0) _exit(126);
        execl(DTRAIN_BIN, DTRAIN_BIN, "--config", "configs/ci-smoke.yaml", "--set", rd, "--set",
              "training.max_steps=400", (char *)NULL);
        _exit(127);
    }
    size_t n = 0;
    for (;;) {
        ssize_t k = read(master, out_text + n, sizeof out_text - 1 - n);
        if (k <= 0) break; /* EIO once the child has exited */
        n += (size_t)k;
    }
    out_text[n] = '\0';
    close(master);
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    CHECK_STR_CONTAINS(out_text, "\r\033[K"); /* the layout and widths: tests/test_progress.c */
    CHECK_STR_CONTAINS(out_text, "%|");
    CHECK_STR_CONTAINS(out_text, " step/s]");
    CHECK_STR_CONTAINS(out_text, "400/400");
    CHECK_STR_CONTAINS(out_text, "done: 400 steps");
    printf("tty: %zu bytes with the progress bar\n", n);
}

/* the verdict under the bench table, from rows as a loaded 2-core machine gave them */
static void test_bench_verdict(void) {
    const dt_bench_env quiet = {.cpu = 1, .cores = 2, .busy_before = 0.05, .tokens_per_worker_step = 2048};
    char text[4096];
    /* "16.66x speedup, 833% efficiency": the one-worker run was slowed; flagged, not a result */
    dt_bench_row rows[3] = {{.workers = 1, .runs = 1, .steps = 500, .train_s = 90, .tokens_per_s = 3600,
                             .tokens_min = 3600, .tokens_max = 3600, .speedup = 1, .efficiency = 1},
                            {.workers = 2, .runs = 1, .steps = 500, .train_s = 11, .tokens_per_s = 59976,
                             .tokens_min = 59976, .tokens_max = 59976, .speedup = 16.66, .efficiency = 8.33}};
    dt_bench_verdict(rows, 2, &quiet, text, sizeof text);
    CHECK_STR_CONTAINS(text, "warning: 2 workers: 833% efficiency (16.66x the throughput with 2x the workers) is above "
                             "100%: with the same batch per worker that is not a real result; the 1-worker run was "
                             "probably slowed");
    CHECK(rows[1].flags == DT_BENCH_SUPERLINEAR && rows[0].flags == 0);
    /* repeats that disagree: too noisy */
    rows[1] = (dt_bench_row){.workers = 2, .runs = 3, .steps = 500, .tokens_per_s = 4000, .tokens_min = 2000,
                             .tokens_max = 5000, .speedup = 1.11, .efficiency = 0.555};
    dt_bench_verdict(rows, 2, &quiet, text, sizeof text);
    CHECK_STR_CONTAINS(text, "warning: 2 workers: its 3 runs differ by 75% in tokens/s (slowest 2000, fastest 5000): too "
                           "noisy to compare");
    CHECK(rows[1].flags == DT_BENCH_NOISY);
    /* under 50%: communication share first */
    rows[1] = (dt_bench_row){.workers = 2, .runs = 3, .steps = 500, .train_s = 60, .tokens_per_s = 2520,
                             .tokens_min = 2500, .tokens_max = 2600, .comm_share = 0.45, .speedup = 0.7,
                             .efficiency = 0.35};
    dt_bench_verdict(rows, 2, &quiet, text, sizeof text);
    CHECK_STR_CONTAINS(text, "note: 2 workers: 35% efficiency: 45% of each step is spent waiting for the gradient "
                             "all-reduce, so communication, not compute, limits scaling: every step sums the whole "
                             "gradient while a worker computes only 2048 tokens");
    CHECK(rows[1].flags == DT_BENCH_LOW);
    /* ... then CPU workers sharing the cores */
    rows[1].comm_share = 0.05;
    dt_bench_verdict(rows, 2, &quiet, text, sizeof text);
    CHECK_STR_CONTAINS(text, "note: 2 workers: 35% efficiency: CPU workers share this machine's 2 cores (cores / "
                             "workers threads each), so more workers add no compute here");
    /* ... then steps too small (GPU workers) */
    dt_bench_env gpu = quiet;
    gpu.cpu = 0;
    dt_bench_verdict(rows, 2, &gpu, text, sizeof text);
    CHECK_STR_CONTAINS(text, "only 5% of step time is all-reduce, but each worker's step (120.0 ms for 2048 tokens) is too "
                             "small for the costs every step adds with more workers");
    /* a busy machine before the first run: said, and single runs flagged */
    dt_bench_env busy = quiet;
    busy.busy_before = 1.0;
    rows[0].runs = rows[1].runs = 1;
    dt_bench_verdict(rows, 2, &busy, text, sizeof text);
    CHECK_STR_CONTAINS(text, "warning: 1.0 of the 2 cores were busy with other processes when the bench started");
    CHECK(rows[0].flags & DT_BENCH_NOISY);
    /* a clean sweep: nothing to say */
    rows[1] = (dt_bench_row){.workers = 2, .runs = 1, .steps = 500, .tokens_per_s = 7000, .tokens_min = 7000,
                             .tokens_max = 7000, .speedup = 1.94, .efficiency = 0.97};
    dt_bench_verdict(rows, 2, &quiet, text, sizeof text);
    CHECK_STR_EQ(text, "");
}

/* precision, recall and F1 from a confusion matrix, as scikit-learn computes them */
static void test_class_scores(void) {
    const long conf[9] = {5, 1, 0, /* label 0: 5 right, 1 taken for 1 */
                          2, 3, 1, /* label 1 */
                          0, 0, 0}; /* label 2: no examples, never predicted right */
    dt_class_score sc[3];
    double macro;
    dt_class_scores(conf, 3, sc, &macro);
    CHECK_NEAR_REL(sc[0].precision, 5.0 / 7, 1e-12, 0);
    CHECK_NEAR_REL(sc[0].recall, 5.0 / 6, 1e-12, 0);
    CHECK_NEAR_REL(sc[0].f1, 2 * (5.0 / 7) * (5.0 / 6) / (5.0 / 7 + 5.0 / 6), 1e-12, 0);
    CHECK_NEAR_REL(sc[1].precision, 3.0 / 4, 1e-12, 0);
    CHECK_NEAR_REL(sc[1].recall, 3.0 / 6, 1e-12, 0);
    CHECK(sc[2].precision == 0 && sc[2].recall == 0 && sc[2].f1 == 0); /* predicted once, wrongly; no support */
    CHECK(sc[0].support == 6 && sc[1].support == 6 && sc[2].support == 0);
    CHECK_NEAR_REL(macro, (sc[0].f1 + sc[1].f1 + 0) / 3, 1e-12, 0);
}

static void test_bench(void) {
    test_class_scores();
    test_bench_verdict();
    char rd[1400];
    snprintf(rd, sizeof rd, "run.dir=%s/bench", test_dir());
    /* --repeat 2: both runs of each count, medians and the range */
    const char *rep[] = {"bench", "--config", "configs/ci-smoke.yaml", "--workers", "1,2", "--steps", "10", "--repeat",
                         "2", "--set", rd, NULL};
    CHECK_INT_EQ(run_sync("bench-repeat", rep), 0);
    slurp_out("bench-repeat");
    CHECK_STR_CONTAINS(out_text, "bench: 1 worker x batch 8 (run 1 of 2)");
    CHECK_STR_CONTAINS(out_text, "bench: 2 workers x batch 8 (run 2 of 2)");
    CHECK_STR_CONTAINS(out_text, "all-reduce wait  MB sent/step  tokens/s min-max\n      1      10 ");
    CHECK_STR_CONTAINS(out_text, "from the medians of the runs");
    char p2[1300];
    snprintf(p2, sizeof p2, "%s/bench/bench/w2-r2/metrics.jsonl", test_dir());
    CHECK(access(p2, F_OK) == 0);
    const char *badrep[] = {"bench", "--config", "configs/ci-smoke.yaml", "--workers", "1", "--repeat", "0", NULL};
    CHECK_INT_EQ(run_sync("bench-badrep", badrep), 2);
    CHECK_STR_CONTAINS(err_text, "--repeat: expected an integer 1..20, got \"0\"");
    const char *args[] = {"bench", "--config", "configs/ci-smoke.yaml", "--workers", "2,1", "--steps", "60", "--set",
                          rd, NULL};
    CHECK_INT_EQ(run_sync("bench", args), 0);
    slurp_out("bench");
    CHECK_STR_CONTAINS(out_text, "workers   steps    train s    eval s   samples/s    tokens/s  speedup  efficiency  "
                                 "all-reduce wait  MB sent/step\n      1      60 ");
    CHECK_STR_CONTAINS(out_text, "\n      2      60 ");
    CHECK_STR_CONTAINS(out_text, "1.00x        100%");
    char path[1300], text[1 << 14];
    snprintf(path, sizeof path, "%s/bench/bench/bench.csv", test_dir());
    test_slurp(path, text, sizeof text);
    CHECK_STR_CONTAINS(text, "workers,steps,train_s,eval_s,samples_per_s,tokens_per_s,speedup,efficiency,comm_share,runs,"
                             "tokens_per_s_min,tokens_per_s_max,flags,sent_bytes_per_step,layout,tensor_parallel,"
                             "rss_mb,pipeline_parallel,micro_batches,bubble\n1,60,");
    CHECK_STR_CONTAINS(text, "\n2,60,");
    /* bytes sent per step: none alone; with 2 workers the gradients once (2(N-1)/N = 1 x 4 bytes
     * a parameter) and a few bytes of agreement */
    const char *w1 = strstr(text, "\n1,60,"), *w2 = strstr(text, "\n2,60,");
    CHECK(w1 && w2);
    double s1 = -1, s2 = -1; /* column 14, sent_bytes_per_step */
    for (int k = 0; k < 2; k++) {
        const char *c = k ? w2 : w1;
        for (int col = 0; c && col < 13; col++) c = strchr(c + 1, ',');
        CHECK(c != NULL);
        if (c) *(k ? &s2 : &s1) = strtod(c + 1, NULL);
    }
    char dry[1300];
    snprintf(dry, sizeof dry, "%s/bench/bench/w2/config.yaml", test_dir());
    const char *dargs[] = {"--config", dry, "--dry-run", NULL};
    CHECK_INT_EQ(run_sync("bench-dry", dargs), 0);
    slurp_out("bench-dry");
    const char *pp = strstr(out_text, "parameters (");
    const double params = pp ? strtod(pp + 12, NULL) : 0;
    printf("bench: sent per step %.0f (1 worker), %.0f (2 workers); 4 x %.0f parameters = %.0f\n", s1, s2, params,
           4 * params);
    CHECK(s1 == 0);
    CHECK(params > 0 && s2 >= 4 * params && s2 < 4 * params + 4096);
    int lines = 0;
    for (const char *p = text; *p; p++) lines += *p == '\n';
    CHECK_INT_EQ(lines, 3);
    snprintf(path, sizeof path, "%s/bench/bench/bench.svg", test_dir());
    test_slurp(path, text, sizeof text);
    CHECK(strlen(text) > 1000);
    CHECK_STR_CONTAINS(text, "<svg xmlns=\"http://www.w3.org/2000/svg\"");
    CHECK_STR_CONTAINS(text, "scaling efficiency");
    CHECK_STR_CONTAINS(text, "</svg>\n");
    /* bad usage */
    const char *bad[] = {"bench", "--config", "configs/ci-smoke.yaml", "--workers", "1,x", NULL};
    CHECK_INT_EQ(run_sync("bench-bad", bad), 2);
    CHECK_STR_CONTAINS(err_text, "--workers: expected worker counts 1..64 separated by commas");
}

static void test_version(void) {
    const char *args[] = {"--version", NULL};
    CHECK_INT_EQ(run_sync("version", args), 0);
    slurp_out("version");
    CHECK_STR_CONTAINS(out_text, "libyaml   ");
    CHECK_STR_CONTAINS(out_text, "zlib      ");
    CHECK_STR_CONTAINS(out_text, "OpenBLAS  ");
    CHECK_STR_CONTAINS(out_text, "(built with ");
    CHECK_STR_CONTAINS(out_text, "CUDA      ");
    /* this machine runs what it was built with */
    CHECK_STR_CONTAINS(out_text, "every library found matches the version dtrain was built with");
    CHECK(strstr(out_text, "MISMATCH") == NULL);
}

static void test_units(void) {
    CHECK(dt_crc32c("123456789", 9) == 0xE3069283u); /* the CRC-32C check value */
    CHECK(dt_crc32c("", 0) == 0);
    double cpu, rss, peak;
    volatile double x = 0;
    for (int i = 0; i < 20000000; i++) x += i * 1e-9;
    CHECK(dt_proc_read(getpid(), &cpu, &rss, &peak) == DT_OK);
    CHECK(cpu > 0 && rss > 0.5 && peak >= rss);
    CHECK(dt_proc_read(999999999, &cpu, &rss, &peak) == DT_ERR_IO);

    dt_worker_slot slot;
    memset(&slot, 0, sizeof slot);
    dt_worker_sample s = {.pid = 42, .cpu_pct = 97.5, .rss_mb = 100, .peak_rss_mb = 120, .samples = 3};
    dt_worker_slot_publish(&slot, &s);
    dt_worker_sample r = dt_worker_slot_read(&slot);
    CHECK(r.pid == 42 && r.cpu_pct == 97.5 && r.samples == 3);

    dt_worker_sample round[3] = {{.pid = 10, .cpu_pct = 98, .samples = 3},
                                 {.pid = 11, .cpu_pct = 3, .samples = 3},
                                 {.pid = 12, .cpu_pct = 95, .samples = 3}};
    char msg[512];
    CHECK_INT_EQ(dt_monitor_idle_rank(round, 3, 2.0, msg, sizeof msg), 1);
    CHECK_STR_CONTAINS(msg, "rank 1 (pid 11) is idle: 3% CPU over the last 2 s while the other workers used 95-98%");
    round[2].cpu_pct = 20; /* the others are not busy either: nobody is singled out */
    CHECK_INT_EQ(dt_monitor_idle_rank(round, 3, 2.0, msg, sizeof msg), -1);
    round[2].cpu_pct = 95;
    round[1].samples = 0; /* no sample yet */
    CHECK_INT_EQ(dt_monitor_idle_rank(round, 3, 2.0, msg, sizeof msg), -1);
}

int main(void) {
    test_dir_init("monitoring");
    test_units();
    test_version();
    test_run_outputs();
    test_phase_times();
    test_tty_bar();
    test_bench();
    test_dir_remove();
    TEST_PASS("test_monitoring");
}
