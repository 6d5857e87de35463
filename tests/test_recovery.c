/* test_recovery.c — checkpoints, resume, restarts and preemption through the real binary:
 *   - bit-exact continuation: 20 steps straight == 10 steps, a crash, and a rerun that
 *     resumes for 10 (identical model.safetensors bytes);
 *   - a worker killed at step 7 (checkpoints every 5): one restart, identical weights;
 *   - a worker stopped (SIGSTOP) at step 7: the collective deadline, one restart, identical;
 *   - SIGTERM mid-run: exit 0 with a checkpoint at the current step; a rerun resumes there;
 *   - SIGTERM during a long evaluation (minutes), to dtrain or to one of two processes another
 *     launcher started: every rank stops within seconds, the partial evaluation is not
 *     recorded, and the checkpoint of the step is written;
 *   - a checkpoint with a flipped byte and one with a truncated file: both reported, the one
 *     before them used, and the result still identical;
 *   - 2 workers -> 4 workers: the epoch's samples are each seen exactly once;
 *   - training.zero_stage 1 (sharded AdamW): a worker killed at step 7, while the other waits
 *     in a reduce-scatter, restarts to weights identical to an unkilled sharded run; its
 *     checkpoint (global) resumed by one worker without sharding, and a plain checkpoint by 4
 *     sharded workers, end where the straight runs end (1e-5);
 *   - a different model shape is refused; a second SIGINT stops at once;
 *   - kill -9 of the launcher: the workers die with it. */
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "proc.h"
#include "testutil.h"
#include "weights.h"

#define MAX_ARGS 48

static char out_text[1 << 18];

/* dtrain --config ci-smoke --set run.dir=RUN plus the given overrides (NULL-terminated);
 * starts it and returns the pid. */
static pid_t start(const char *tag, const char *run, const char *const *sets) {
    static char rd[MAX_ARGS][1400];
    const char *args[MAX_ARGS];
    int n = 0;
    args[n++] = "--config";
    args[n++] = "configs/ci-smoke.yaml";
    snprintf(rd[0], sizeof rd[0], "run.dir=%s/%s", test_dir(), run);
    args[n++] = "--set";
    args[n++] = rd[0];
    for (int i = 0; sets && sets[i] && n < MAX_ARGS - 3; i++) {
        args[n++] = "--set";
        args[n++] = sets[i];
    }
    args[n++] = "--progress";
    args[n++] = "never";
    args[n] = NULL;
    return spawn(tag, args);
}

/* Runs to the end; returns the exit status; stderr in err_text, stdout in out_text. */
static int run(const char *tag, const char *run_dir, const char *const *sets) {
    int rc = wait_exit(start(tag, run_dir, sets), tag);
    char path[1300];
    snprintf(path, sizeof path, "%s/%s.out", test_dir(), tag);
    test_slurp(path, out_text, sizeof out_text);
    return rc;
}

static long file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? (long)sb.st_size : -1;
}

/* exists and is not a zombie (orphans are reaped by whatever PID 1 the machine has) */
static int running(pid_t pid) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    test_slurp(path, buf, sizeof buf);
    const char *close = strrchr(buf, ')');
    return close && close[1] == ' ' && close[2] != 'Z' && close[2] != 'X';
}

static int count_occurrences(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)) != NULL; p++) n++;
    return n;
}

/* the last "train" step in a run's metrics.jsonl */
static long last_logged_step(const char *run_dir) {
    char path[1300], line[4096];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", test_dir(), run_dir);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    long step = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (o && strcmp(json_string_value(json_object_get(o, "type")), "train") == 0)
            step = (long)json_integer_value(json_object_get(o, "step"));
        json_decref(o);
    }
    fclose(f);
    return step;
}

static long trainer_step(const char *ckpt_dir) {
    char path[1400];
    snprintf(path, sizeof path, "%s/trainer.json", ckpt_dir);
    json_t *o = json_load_file(path, 0, NULL);
    CHECK(o != NULL);
    long s = (long)json_integer_value(json_object_get(o, "step"));
    json_decref(o);
    return s;
}

static const char *const one_worker[] = {"checkpoint.every_steps=5", "fault_tolerance.backoff_s=0.1", NULL};
static const char *const two_workers[] = {"checkpoint.every_steps=5", "fault_tolerance.backoff_s=0.1",
                                          "training.num_workers=2", "data.batch_size_per_worker=4",
                                          "training.collective_timeout_s=2", NULL};

static void test_continuation(void) {
    CHECK_INT_EQ(run("straight1", "straight1", one_worker), 0);
    /* a crash right after the checkpoint of step 10, no restarts: the run fails */
    setenv("DTRAIN_FAULT", "rank=0,step=11,kind=exit", 1);
    const char *const no_restart[] = {"checkpoint.every_steps=10", "fault_tolerance.max_restarts=0", NULL};
    CHECK_INT_EQ(run("cont-a", "cont", no_restart), 1);
    unsetenv("DTRAIN_FAULT");
    CHECK_STR_CONTAINS(err_text, "worker rank 0 exited with status 3");
    /* the rerun resumes at step 10 and trains the other 10 */
    CHECK_INT_EQ(run("cont-b", "cont", no_restart), 0);
    CHECK_STR_CONTAINS(out_text, "/cont/checkpoints/step_00000010: step 10, epoch 1, sample 80 of the epoch");
    CHECK_STR_CONTAINS(out_text, "done: 10 steps");
    test_same_weights("straight1", "cont");
}

static void test_kill_restart(void) {
    CHECK_INT_EQ(run("straight2", "straight2", two_workers), 0);
    setenv("DTRAIN_FAULT", "rank=1,step=7,kind=kill", 1);
    CHECK_INT_EQ(run("killed", "killed", two_workers), 0);
    unsetenv("DTRAIN_FAULT");
    CHECK_STR_CONTAINS(err_text, "worker rank 1 was killed by signal 9 (SIGKILL)");
    CHECK_INT_EQ(count_occurrences(err_text, "restart 1 of 3 in 0.1 s"), 1);
    CHECK_INT_EQ(count_occurrences(err_text, "restart 2 of"), 0);
    CHECK_STR_CONTAINS(out_text, "/killed/checkpoints/step_00000005: step 5, epoch 1, sample 40 of the epoch (after a restart)");
    test_same_weights("straight2", "killed");
    /* the restart is in train.log too */
    char path[1300], log[1 << 16];
    snprintf(path, sizeof path, "%s/killed/train.log", test_dir());
    test_slurp(path, log, sizeof log);
    CHECK_STR_CONTAINS(log, "restart 1 of 3");
    /* and metrics.jsonl marks where the restarted attempt took over */
    static char jsonl[1 << 16];
    snprintf(path, sizeof path, "%s/killed/metrics.jsonl", test_dir());
    test_slurp(path, jsonl, sizeof jsonl);
    CHECK_STR_CONTAINS(jsonl, ",\"type\":\"resume\",\"step\":5,\"checkpoint\":\"");
    CHECK_STR_CONTAINS(jsonl, "/killed/checkpoints/step_00000005\",\"attempt\":1}");
}

static const char *const two_zero[] = {"checkpoint.every_steps=5", "fault_tolerance.backoff_s=0.1",
                                       "training.num_workers=2", "data.batch_size_per_worker=4",
                                       "training.collective_timeout_s=2", "training.zero_stage=1", NULL};

static void test_zero_restart(void) {
    CHECK_INT_EQ(run("straight-z", "straight-z", two_zero), 0);
    CHECK_STR_CONTAINS(out_text, "shm reduce-scatter + all-gather");
    printf("sharded vs plain, 2 workers: weights rel L2 distance %.2e\n", run_distance("straight-z", "straight2"));
    CHECK(run_distance("straight-z", "straight2") <= 1e-5);
    setenv("DTRAIN_FAULT", "rank=1,step=7,kind=kill", 1);
    CHECK_INT_EQ(run("killed-z", "killed-z", two_zero), 0);
    unsetenv("DTRAIN_FAULT");
    CHECK_STR_CONTAINS(err_text, "worker rank 1 was killed by signal 9 (SIGKILL)");
    CHECK_STR_CONTAINS(out_text, "/killed-z/checkpoints/step_00000005: step 5, epoch 1, sample 40 of the epoch (after a restart)");
    test_same_weights("straight-z", "killed-z");
    /* the sharded run's checkpoint of step 10, resumed by one worker without sharding */
    setenv("DTRAIN_FAULT", "rank=0,step=11,kind=exit", 1);
    const char *const zero_stop[] = {"checkpoint.every_steps=10", "fault_tolerance.max_restarts=0",
                                     "training.num_workers=2", "data.batch_size_per_worker=4",
                                     "training.zero_stage=1", NULL};
    CHECK_INT_EQ(run("z2one-a", "z2one", zero_stop), 1);
    unsetenv("DTRAIN_FAULT");
    const char *const one_plain[] = {"checkpoint.every_steps=10", NULL};
    CHECK_INT_EQ(run("z2one-b", "z2one", one_plain), 0);
    CHECK_STR_CONTAINS(out_text, "/z2one/checkpoints/step_00000010: step 10, epoch 1, sample 80 of the epoch");
    CHECK_STR_CONTAINS(out_text, "done: 10 steps");
    printf("2 sharded -> 1 plain vs 1 straight: weights rel L2 distance %.2e\n", run_distance("z2one", "straight1"));
    CHECK(run_distance("z2one", "straight1") <= 1e-5);
    /* a plain one-worker checkpoint of step 10, resumed by 4 sharded workers */
    setenv("DTRAIN_FAULT", "rank=0,step=11,kind=exit", 1);
    const char *const one_stop[] = {"checkpoint.every_steps=10", "fault_tolerance.max_restarts=0", NULL};
    CHECK_INT_EQ(run("one2z-a", "one2z", one_stop), 1);
    unsetenv("DTRAIN_FAULT");
    const char *const four_zero[] = {"checkpoint.every_steps=10", "training.num_workers=4", "data.batch_size_per_worker=2",
                                     "training.zero_stage=1", NULL};
    CHECK_INT_EQ(run("one2z-b", "one2z", four_zero), 0);
    CHECK_STR_CONTAINS(out_text, "training.zero_stage 1: rank 0 updates ");
    CHECK_STR_CONTAINS(out_text, "done: 10 steps");
    printf("1 plain -> 4 sharded vs 1 straight: weights rel L2 distance %.2e\n", run_distance("one2z", "straight1"));
    CHECK(run_distance("one2z", "straight1") <= 1e-5);
}

static void test_hang_restart(void) {
    setenv("DTRAIN_FAULT", "rank=1,step=7,kind=hang", 1);
    CHECK_INT_EQ(run("hung", "hung", two_workers), 0);
    unsetenv("DTRAIN_FAULT");
    CHECK_STR_CONTAINS(err_text, "collective timeout");
    CHECK_STR_CONTAINS(err_text, "waited 2.0 s for rank(s) 1");
    CHECK_INT_EQ(count_occurrences(err_text, "restart 1 of 3"), 1);
    test_same_weights("straight2", "hung");
}

static void test_restarts_exhausted(void) {
    /* a fault in every attempt: with max_restarts 1 the run gives up and names both causes */
    setenv("DTRAIN_FAULT", "rank=0,step=3,kind=exit,attempt=any", 1);
    const char *const sets[] = {"fault_tolerance.max_restarts=1", "fault_tolerance.backoff_s=0.1", NULL};
    CHECK_INT_EQ(run("exhaust", "exhaust", sets), 1);
    unsetenv("DTRAIN_FAULT");
    CHECK_INT_EQ(count_occurrences(err_text, "restart 1 of 1 in 0.1 s"), 1);
    CHECK_STR_CONTAINS(err_text, "dtrain: training failed (attempt 1): worker rank 0 exited with status 3 during training");
    CHECK_STR_CONTAINS(err_text, "dtrain: training failed (attempt 2): worker rank 0 exited with status 3 during training");
    CHECK_STR_CONTAINS(err_text, "dtrain: error: training failed 2 times, giving up (fault_tolerance.max_restarts: 1; "
                                 "each cause is above); the last: worker rank 0 exited with status 3");
    /* a bad DTRAIN_FAULT is a usage error, not a crash to restart */
    setenv("DTRAIN_FAULT", "rank=0,step=3,kind=explode", 1);
    CHECK_INT_EQ(run("badfault", "badfault", sets), 2);
    unsetenv("DTRAIN_FAULT");
    CHECK_STR_CONTAINS(err_text, "DTRAIN_FAULT: kind: expected kill, exit, hang or corrupt-checkpoint, got \"explode\"");
    CHECK(strstr(err_text, "restart") == NULL);
}

static void test_sigterm(void) {
    const char *const sets[] = {"training.max_steps=200000", "training.num_workers=2", "data.batch_size_per_worker=4",
                                NULL};
    pid_t pid = start("preempt", "preempt", sets);
    for (int i = 0; i < 1000 && last_logged_step("preempt") < 30; i++) sleep_ms(20);
    CHECK(last_logged_step("preempt") >= 30);
    CHECK_INT_EQ(signal_and_wait(pid, SIGTERM, pid, "preempt", NULL), 0);
    CHECK_STR_CONTAINS(err_text, "dtrain: SIGTERM: stopped at step ");
    CHECK_STR_CONTAINS(err_text, "to resume, run the same command again");
    long step = last_logged_step("preempt");
    char ckpt[1300], want[1500];
    snprintf(ckpt, sizeof ckpt, "%s/preempt/checkpoints/step_%08ld", test_dir(), step);
    CHECK_INT_EQ(trainer_step(ckpt), step);
    snprintf(want, sizeof want, "stopped at step %ld of 200000 with a checkpoint in %s", step, ckpt);
    CHECK_STR_CONTAINS(err_text, want);
    /* the rerun continues from it */
    char until[64];
    snprintf(until, sizeof until, "training.max_steps=%ld", step + 10);
    const char *const again[] = {until, "training.num_workers=2", "data.batch_size_per_worker=4", NULL};
    CHECK_INT_EQ(run("preempt-resume", "preempt", again), 0);
    snprintf(want, sizeof want, "resumed from %s: step %ld", ckpt, step);
    CHECK_STR_CONTAINS(out_text, want);
    CHECK_STR_CONTAINS(out_text, "config changed since the checkpoint: training.max_steps 200000 -> ");
    CHECK_STR_CONTAINS(out_text, "done: 10 steps");
}

/* The exit status of `pid`, or -1 when it had not exited `cap_s` seconds after t0 (then it is
 * killed: its workers die with it). *seconds: from t0 to the exit. */
static int wait_within(pid_t pid, const char *tag, const struct timespec *t0, double cap_s, double *seconds) {
    struct timespec t1;
    int status = 0;
    pid_t got = 0;
    for (int i = 0; i < (int)(cap_s * 50) && (got = waitpid(pid, &status, WNOHANG)) == 0; i++) sleep_ms(20);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    *seconds = (double)(t1.tv_sec - t0->tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
    if (got == pid) {
        char err[1300];
        snprintf(err, sizeof err, "%s/%s.err", test_dir(), tag);
        test_slurp(err, err_text, sizeof err_text);
        printf("%s: exited %.2f s after the signal; stderr: %s\n", tag, *seconds, err_text);
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    printf("%s: still running %.1f s after the signal: killed\n", tag, *seconds);
    kill(pid, SIGKILL);
    wait_exit(pid, tag);
    return -1;
}

/* `sig` to `target`, then wait_within for `pid` */
static int signal_and_wait_within(pid_t target, int sig, pid_t pid, const char *tag, double cap_s, double *seconds) {
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(kill(target, sig) == 0);
    return wait_within(pid, tag, &t0, cap_s, seconds);
}

/* `name`'s metrics.jsonl has no eval record, its last train record is of step `step`, and its
 * checkpoint of that step was written; `out`: the console of rank 0 (out_text) */
static void check_eval_stopped(const char *name, const char *out, long step) {
    char ckpt[1300], path[1300], want[96];
    snprintf(ckpt, sizeof ckpt, "%s/%s/checkpoints/step_%08ld", test_dir(), name, step);
    CHECK_INT_EQ(trainer_step(ckpt), step);
    snprintf(path, sizeof path, "%s/%s.out", test_dir(), out);
    test_slurp(path, out_text, sizeof out_text);
    snprintf(want, sizeof want, "evaluation at step %ld stopped after ", step);
    CHECK_STR_CONTAINS(out_text, want);
    CHECK_STR_CONTAINS(out_text, " (asked to stop): not recorded");
    static char jsonl[1 << 16];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", test_dir(), name);
    test_slurp(path, jsonl, sizeof jsonl);
    CHECK(strstr(jsonl, "\"type\":\"eval\"") == NULL);
    CHECK_INT_EQ(last_logged_step(name), step);
}

static void test_sigterm_in_eval(void) {
    /* 100000 validation examples on a wider model: the evaluation at step 2 takes minutes (about
     * 200 s on 2 cores), so a SIGTERM half a second into it must not wait for its end */
    char tsv[1300], val[1400];
    snprintf(tsv, sizeof tsv, "%s/long-val.tsv", test_dir());
    proc_clear_launcher_env();
    const int n = 100000;
    char *buf = malloc((size_t)n * 32), *p = buf;
    CHECK(buf != NULL);
    for (int i = 0; i < n; i++) p += sprintf(p, "%d\tvalidation example %d\n", i % 2, i);
    test_write_file(tsv, buf, (size_t)(p - buf));
    free(buf);
    snprintf(val, sizeof val, "data.val_path=%s", tsv);
    const char *const sets[] = {val, "training.max_steps=1000", "training.num_workers=2",
                                "data.batch_size_per_worker=4", "model.n_embd=256", "model.n_layer=2",
                                "eval.every_steps=2", "eval.max_batches=0", "logging.every_steps=1", NULL};
    pid_t pid = start("eval-term", "eval-term", sets);
    for (int i = 0; i < 3000 && last_logged_step("eval-term") < 2; i++) sleep_ms(20);
    CHECK_INT_EQ(last_logged_step("eval-term"), 2); /* step 2 logged: its evaluation has begun */
    sleep_ms(500);
    double dt;
    CHECK_INT_EQ(signal_and_wait_within(pid, SIGTERM, pid, "eval-term", 20.0, &dt), 0);
    CHECK(dt < 5.0);
    CHECK_STR_CONTAINS(err_text, "dtrain: SIGTERM: stopped at step 2");
    /* the partial evaluation is said, not recorded as one */
    check_eval_stopped("eval-term", "eval-term", 2);

    /* two processes started by someone else (a Kubernetes Indexed Job), SIGTERM to rank 1 only:
     * rank 0 learns of it through the evaluation's vote and stops with it */
    char port[32];
    snprintf(port, sizeof port, "%d", proc_free_port());
    pid_t ext[2];
    for (int k = 0; k < 2; k++) {
        char index[8], tag[16];
        snprintf(index, sizeof index, "%d", k);
        snprintf(tag, sizeof tag, "eval-ext-%d", k);
        CHECK(setenv("JOB_COMPLETION_INDEX", index, 1) == 0 && setenv("MASTER_ADDR", "127.0.0.1", 1) == 0 &&
              setenv("MASTER_PORT", port, 1) == 0);
        ext[k] = start(tag, "eval-ext", sets);
        proc_clear_launcher_env();
    }
    for (int i = 0; i < 3000 && last_logged_step("eval-ext") < 2; i++) sleep_ms(20);
    CHECK_INT_EQ(last_logged_step("eval-ext"), 2);
    sleep_ms(500);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(kill(ext[1], SIGTERM) == 0);
    double dt0;
    const int rc1 = wait_within(ext[1], "eval-ext-1", &t0, 20.0, &dt);
    const int rc0 = wait_within(ext[0], "eval-ext-0", &t0, 20.0, &dt0);
    CHECK_INT_EQ(rc1, 0);
    CHECK_INT_EQ(rc0, 0);
    CHECK(dt < 5.0 && dt0 < 5.0);
    check_eval_stopped("eval-ext", "eval-ext-0", 2);
}

static void test_signal_to_worker(void) {
    /* a scheduler may signal the workers rather than dtrain: the same clean stop */
    const char *const sets[] = {"training.max_steps=200000", "training.num_workers=2", "data.batch_size_per_worker=4",
                                NULL};
    pid_t pid = start("worker-term", "worker-term", sets);
    pid_t r1 = 0;
    for (int i = 0; i < 500 && !r1; i++) {
        sleep_ms(20);
        r1 = find_child(pid, "dtrain-r1");
    }
    CHECK(r1);
    for (int i = 0; i < 1000 && last_logged_step("worker-term") < 10; i++) sleep_ms(20);
    CHECK_INT_EQ(signal_and_wait(r1, SIGTERM, pid, "worker-term", NULL), 0);
    CHECK_STR_CONTAINS(err_text, "dtrain: SIGTERM: stopped at step ");
    long step = last_logged_step("worker-term");
    char ckpt[1300];
    snprintf(ckpt, sizeof ckpt, "%s/worker-term/checkpoints/step_%08ld", test_dir(), step);
    CHECK_INT_EQ(trainer_step(ckpt), step);
}

static void test_signal_in_backoff(void) {
    /* a failure, then SIGTERM while waiting 30 s to restart: a clean stop at once */
    setenv("DTRAIN_FAULT", "rank=0,step=3,kind=exit", 1);
    const char *const sets[] = {"fault_tolerance.backoff_s=30", "training.max_steps=50", NULL};
    pid_t pid = start("backoff", "backoff", sets);
    unsetenv("DTRAIN_FAULT");
    char path[1300];
    snprintf(path, sizeof path, "%s/backoff.err", test_dir());
    for (int i = 0; i < 500 && !strstr(err_text, "restart 1 of 3 in 30.0 s"); i++) {
        sleep_ms(20);
        test_slurp(path, err_text, sizeof err_text);
    }
    CHECK_STR_CONTAINS(err_text, "restart 1 of 3 in 30.0 s");
    double dt;
    CHECK_INT_EQ(signal_and_wait(pid, SIGTERM, pid, "backoff", &dt), 0);
    CHECK(dt < 5.0);
    CHECK_STR_CONTAINS(err_text, "stopped while waiting to restart after a failure (a rerun continues from the last checkpoint)");
}

static void test_corrupt(void) {
    /* checkpoints at 10, 15, 20; the fault flips a byte of step 20's weights */
    setenv("DTRAIN_FAULT", "step=20,kind=corrupt-checkpoint", 1);
    CHECK_INT_EQ(run("corrupt-a", "corrupt", one_worker), 0);
    unsetenv("DTRAIN_FAULT");
    /* and step 15's optimizer state loses its second half */
    char path[1300];
    snprintf(path, sizeof path, "%s/corrupt/checkpoints/step_00000015/optimizer.safetensors", test_dir());
    long n = file_size(path);
    CHECK(n > 100);
    CHECK(truncate(path, n / 2) == 0);
    /* the final weights go too, to prove the rerun rebuilt them */
    snprintf(path, sizeof path, "%s/corrupt/model.safetensors", test_dir());
    CHECK(unlink(path) == 0);
    CHECK_INT_EQ(run("corrupt-b", "corrupt", one_worker), 0);
    CHECK_STR_CONTAINS(out_text, "step_00000020/model.safetensors: crc32 ");
    CHECK_STR_CONTAINS(out_text, "(the file is corrupt)");
    char want[200];
    snprintf(want, sizeof want, "step_00000015/optimizer.safetensors: %ld bytes, the manifest says %ld", n / 2, n);
    CHECK_STR_CONTAINS(out_text, want);
    CHECK_STR_CONTAINS(out_text, "/corrupt/checkpoints/step_00000010: step 10");
    /* the broken ones are moved aside, not resumed after a restart or counted by keep_last */
    CHECK_STR_CONTAINS(out_text, "moved checkpoints newer than the resume point aside to ");
    test_same_weights("straight1", "corrupt");
    char ckpts[1300];
    snprintf(ckpts, sizeof ckpts, "%s/corrupt/checkpoints", test_dir());
    CHECK_INT_EQ(count_dir(ckpts), 3); /* 10, and the new 15 and 20 */
    for (int s = 10; s <= 20; s += 5) {
        char d[1400];
        snprintf(d, sizeof d, "%s/step_%08d", ckpts, s);
        CHECK_INT_EQ(trainer_step(d), s);
    }
}

static void test_elastic(void) {
    /* 100 examples; 2 workers x 2 for 7 steps (28 samples), then 4 workers x 2 to the end of
     * the epoch (9 steps, 72 samples): every example exactly once */
    char tsv[1300], buf[64 * 100], *p = buf;
    snprintf(tsv, sizeof tsv, "%s/small.tsv", test_dir());
    for (int i = 0; i < 100; i++) p += sprintf(p, "%d\texample number %d\n", i % 2, i);
    test_write_file(tsv, buf, (size_t)(p - buf));
    char data[1400], logdir[1300];
    snprintf(data, sizeof data, "data.train_path=%s", tsv);
    snprintf(logdir, sizeof logdir, "%s/samples", test_dir());
    test_mkdir_p(logdir);
    setenv("DTRAIN_TEST_SAMPLE_LOG", logdir, 1);
    const char *const first[] = {data, "training.num_workers=2", "data.batch_size_per_worker=2", "training.max_steps=7",
                                 "eval.every_steps=0", NULL};
    CHECK_INT_EQ(run("elastic-a", "elastic", first), 0);
    const char *const second[] = {data, "training.num_workers=4", "data.batch_size_per_worker=2", "training.max_steps=0",
                                  "training.epochs=1", "eval.every_steps=0", NULL};
    CHECK_INT_EQ(run("elastic-b", "elastic", second), 0);
    unsetenv("DTRAIN_TEST_SAMPLE_LOG");
    CHECK_STR_CONTAINS(out_text, "step 7, epoch 1, sample 28 of the epoch");
    CHECK_STR_CONTAINS(out_text, "elastic resume: global batch 4 (2 workers at save) -> 8 (4 now)");
    CHECK_STR_CONTAINS(out_text, "done: 9 steps");
    int seen[100] = {0}, lines = 0;
    for (int r = 0; r < 4; r++) {
        char path[1400];
        snprintf(path, sizeof path, "%s/samples-rank-%d.txt", logdir, r);
        FILE *f = fopen(path, "r");
        CHECK(f != NULL);
        long epoch;
        size_t idx;
        while (fscanf(f, "%ld %zu", &epoch, &idx) == 2) {
            CHECK_INT_EQ(epoch, 0);
            CHECK(idx < 100);
            seen[idx]++;
            lines++;
        }
        fclose(f);
    }
    CHECK_INT_EQ(lines, 100);
    for (int i = 0; i < 100; i++) CHECK_INT_EQ(seen[i], 1);
}

static void test_shape_refused(void) {
    const char *const sets[] = {"model.n_layer=2", NULL};
    CHECK_INT_EQ(run("shape", "straight1", sets), 2);
    CHECK_STR_CONTAINS(err_text, "checkpoint trained with model.n_layer: 1, the config says 2: refusing to resume");
    /* checkpoint.resume: never starts fresh and keeps the old checkpoints aside */
    const char *const fresh[] = {"model.n_layer=2", "checkpoint.resume=never", "training.max_steps=5", NULL};
    CHECK_INT_EQ(run("fresh", "straight1", fresh), 0);
    CHECK_STR_CONTAINS(out_text, "moved the earlier checkpoints aside to ");
    CHECK(strstr(out_text, "resumed from") == NULL);
}

static void test_second_sigint(void) {
    /* rank 1 stops itself at step 3, so the first SIGINT cannot finish the step; the second
     * one must end the run at once */
    setenv("DTRAIN_FAULT", "rank=1,step=3,kind=hang", 1);
    const char *const sets[] = {"training.num_workers=2", "data.batch_size_per_worker=4",
                                "training.collective_timeout_s=60", "training.max_steps=1000", NULL};
    pid_t pid = start("sigint", "sigint", sets);
    unsetenv("DTRAIN_FAULT");
    for (int i = 0; i < 500 && last_logged_step("sigint") < 2; i++) sleep_ms(20);
    sleep_ms(300);
    CHECK(kill(pid, SIGINT) == 0);
    sleep_ms(300);
    int status;
    CHECK_INT_EQ(waitpid(pid, &status, WNOHANG), 0); /* still waiting for the stuck step */
    double dt;
    int rc = signal_and_wait(pid, SIGINT, pid, "sigint", &dt);
    CHECK_INT_EQ(rc, 1);
    CHECK_STR_CONTAINS(err_text, "interrupted by SIGINT twice");
    CHECK(dt < 5.0);
}

static void test_launcher_killed(void) {
    const char *const sets[] = {"training.num_workers=2", "data.batch_size_per_worker=4", "training.max_steps=1000000",
                                NULL};
    pid_t pid = start("orphans", "orphans", sets);
    pid_t r0 = 0, r1 = 0;
    for (int i = 0; i < 500 && !(r0 && r1); i++) {
        sleep_ms(20);
        if (!r0) r0 = find_child(pid, "dtrain-r0");
        if (!r1) r1 = find_child(pid, "dtrain-r1");
    }
    CHECK(r0 && r1);
    CHECK_INT_EQ(signal_and_wait(pid, SIGKILL, pid, "orphans", NULL), 128 + SIGKILL);
    int gone = 0;
    for (int i = 0; i < 250 && !gone; i++) { /* up to 5 s */
        gone = !running(r0) && !running(r1);
        if (!gone) sleep_ms(20);
    }
    CHECK(gone);
}

/* test_recovery [NAME...]: those tests only (e.g. sigterm_in_eval; a test that compares with an
 * earlier one's run needs that one named too), else all */
static int wanted(int argc, char **argv, const char *name) {
    if (argc < 2) return 1;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], name) == 0) return 1;
    return 0;
}

#define RUN(name) \
    if (wanted(argc, argv, #name)) test_##name()

int main(int argc, char **argv) {
    test_dir_init("recovery");
    unsetenv("DTRAIN_FAULT");
    RUN(continuation);
    RUN(kill_restart);
    RUN(zero_restart);
    RUN(hang_restart);
    RUN(restarts_exhausted);
    RUN(sigterm);
    RUN(sigterm_in_eval);
    RUN(signal_to_worker);
    RUN(signal_in_backoff);
    RUN(corrupt);
    RUN(elastic);
    RUN(shape_refused);
    RUN(second_sigint);
    RUN(launcher_killed);
    test_dir_remove();
    TEST_PASS("test_recovery");
}
