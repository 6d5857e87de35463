/* test_multiworker.c — N workers through the real binary, as a user runs them:
 *   - equivalence: 1 worker x batch 8, 2 x 4, 4 x 2 and 2 x 2 with grad_accum_steps 2 give
 *     the same per-step losses (1e-5 relative) for 20 steps and the same final weights
 *     (relative L2 distance <= 1e-5); so do 2 x 4, 4 x 2 and 2 x 2 x 2 with the AdamW state
 *     sharded (training.zero_stage 1), whose weights are moreover the same bytes as without
 *     sharding (shm sums a reduce-scatter in the all-reduce's order), run after run;
 *   - bf16 gradients (training.grad_comm_dtype): the shipped fine-tune's accuracy within 0.01
 *     of fp32 communication, half the gradients' bytes, with and without zero_stage 1;
 *   - kill -9 of worker 1 mid-run: exit 1, one message naming rank 1 and SIGKILL, no
 *     process left behind, nothing new in /dev/shm;
 *   - SIGSTOP of worker 1: the others time out at the collective deadline naming rank 1;
 *   - a replica perturbed on rank 1 (test-only switch) is caught at the next check;
 *   - `dtrain doctor` passes (library versions listed; tables for all-reduce, reduce-scatter and
 *     all-gather of parts; no bandwidth table for one worker), and
 *     fails when the all-reduce is broken (test-only switch). */
#include <dirent.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "dtrain/safetensors.h"
#include "proc.h"
#include "weights.h"
#include "testutil.h"

static void test_equivalence(void) {
    enum { N_SETUPS = 8 };
    const int setups[N_SETUPS][4] = {{1, 8, 1, 0}, {2, 4, 1, 0}, {4, 2, 1, 0}, {2, 2, 2, 0}, /* workers, batch, */
                                     {2, 4, 1, 1}, {4, 2, 1, 1}, {2, 2, 2, 1}, {2, 4, 1, 1}}; /* accum, zero */
    double base[32];
    char conf_base[1024], conf[1024];
    float *wbase = NULL;
    size_t nbase = 0;
    for (int s = 0; s < N_SETUPS; s++) {
        char tag[64], run[1300], nw[64], bs[64], ga[64], rd[1400], zs[64];
        snprintf(tag, sizeof tag, "eq-%dx%dx%d%s%s", setups[s][0], setups[s][1], setups[s][2],
                 setups[s][3] ? "-zero" : "", s == N_SETUPS - 1 ? "-again" : "");
        snprintf(zs, sizeof zs, "training.zero_stage=%d", setups[s][3]);
        snprintf(run, sizeof run, "%s/%s", test_dir(), tag);
        snprintf(nw, sizeof nw, "training.num_workers=%d", setups[s][0]);
        snprintf(bs, sizeof bs, "data.batch_size_per_worker=%d", setups[s][1]);
        snprintf(ga, sizeof ga, "training.grad_accum_steps=%d", setups[s][2]);
        snprintf(rd, sizeof rd, "run.dir=%s", run);
        const char *args[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", nw, "--set", bs,
                              "--set", ga, "--set", zs, "--set", "training.max_steps=20", "--set", "training.check_replicas_every=5",
                              "--set", "eval.max_batches=0", "--quiet", NULL}; /* all of val: the same examples */
        CHECK_INT_EQ(run_sync(tag, args), 0);
        double loss[32];
        CHECK_INT_EQ(read_losses(run, loss, 32), 20);
        size_t n;
        float *w = read_weights(run, &n);
        read_confusion(run, s == 0 ? conf_base : conf, sizeof conf);
        if (s == 0) {
            memcpy(base, loss, sizeof loss);
            wbase = w;
            nbase = n;
            continue;
        }
        double worst = 0;
        for (int i = 0; i < 20; i++) {
            CHECK_NEAR_REL(loss[i], base[i], 1e-5, 0);
            worst = fmax(worst, fabs(loss[i] - base[i]) / fabs(base[i]));
        }
        CHECK_INT_EQ(n, nbase);
        double dist = rel_l2(w, wbase, n);
        printf("%s vs 1x8x1: worst loss rel diff %.2e, weights rel L2 distance %.2e\n", tag, worst, dist);
        CHECK(dist <= 1e-5);
        CHECK_STR_EQ(conf, conf_base); /* every worker's predictions counted once: the same matrix */
        free(w);
        if (setups[s][3]) { /* sharded: the bytes of the same setup without sharding */
            char plain[64];
            snprintf(plain, sizeof plain, "eq-%dx%dx%d", setups[s][0], setups[s][1], setups[s][2]);
            test_same_weights(tag, plain);
        }
    }
    free(wbase);
}

/* Starts a long 2-worker run, waits for both workers, returns the launcher pid. */
static pid_t start_long_run(const char *tag, const char *timeout, pid_t *r0, pid_t *r1) {
    char run[1300], rd[1400], to[64];
    snprintf(run, sizeof run, "%s/%s", test_dir(), tag);
    snprintf(rd, sizeof rd, "run.dir=%s", run);
    snprintf(to, sizeof to, "training.collective_timeout_s=%s", timeout);
    const char *args[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", "training.num_workers=2",
                          "--set", "data.batch_size_per_worker=4", "--set", "training.max_steps=1000000",
                          "--set", to, "--set", "fault_tolerance.max_restarts=0", "--quiet", NULL};
    pid_t pid = spawn(tag, args);
    *r0 = *r1 = 0;
    for (int i = 0; i < 500 && !(*r0 && *r1); i++) { /* up to 10 s */
        sleep_ms(20);
        if (!*r0) *r0 = find_child(pid, "dtrain-r0");
        if (!*r1) *r1 = find_child(pid, "dtrain-r1");
    }
    CHECK(*r0 && *r1);
    char path[1400];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    for (int i = 0; i < 500 && access(path, F_OK) != 0; i++) sleep_ms(20); /* training has begun */
    sleep_ms(300);
    return pid;
}

static void test_kill_worker(void) {
    int shm_before = count_dir("/dev/shm");
    pid_t r0, r1;
    pid_t pid = start_long_run("kill", "30", &r0, &r1);
    double dt;
    int rc = signal_and_wait(r1, SIGKILL, pid, "kill", &dt);
    CHECK_INT_EQ(rc, 1);
    CHECK_STR_CONTAINS(err_text, "worker rank 1 was killed by signal 9 (SIGKILL)");
    CHECK_STR_CONTAINS(err_text, "rank-1.log");
    /* a SIGKILL nobody in dtrain sent: the out-of-memory killer is named as the usual cause */
    CHECK_STR_CONTAINS(err_text, "a SIGKILL from outside dtrain is often the kernel's out-of-memory killer");
    CHECK(dt < 5.0);
    CHECK(!alive(r0) && !alive(r1));
    CHECK_INT_EQ(count_dir("/dev/shm"), shm_before);
}

static void test_stop_worker(void) {
    pid_t r0, r1;
    pid_t pid = start_long_run("stop", "2", &r0, &r1);
    CHECK(kill(r1, SIGSTOP) == 0);
    int rc = wait_exit(pid, "stop");
    CHECK_INT_EQ(rc, 1);
    CHECK_STR_CONTAINS(err_text, "rank 0: collective timeout");
    CHECK_STR_CONTAINS(err_text, "waited 2.0 s for rank(s) 1");
    char want[96]; /* the launcher sees it stopped */
    snprintf(want, sizeof want, "; worker rank 1 (pid %ld) is stopped", (long)r1);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK_STR_CONTAINS(err_text, "is stopped (process state T: SIGSTOP, Ctrl-Z or a debugger)");
    CHECK(!alive(r0) && !alive(r1));
}

static void test_perturbed_replica(void) {
    char rd[1400];
    snprintf(rd, sizeof rd, "run.dir=%s/perturb", test_dir());
    /* n_embd 384: 1.87M parameters, so the check sums its CRC in two parts, and the hook changes
     * the last parameter, in the second */
    const char *args[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", "training.num_workers=3",
                          "--set", "training.check_replicas_every=5", "--set", "fault_tolerance.max_restarts=0",
                          "--set", "model.n_embd=384", "--quiet", NULL};
    CHECK(setenv("DTRAIN_TEST_PERTURB_REPLICA", "1", 1) == 0);
    int rc = run_sync("perturb", args);
    unsetenv("DTRAIN_TEST_PERTURB_REPLICA");
    CHECK_INT_EQ(rc, 1);
    CHECK_STR_CONTAINS(err_text, "step 5: replica check failed: the parameters of rank 1 (crc32");
}

/* The summary record's number `key` of a run's metrics.jsonl. */
static double summary_number(const char *run, const char *key) {
    char path[1300], line[1 << 14];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    double v = NAN;
    while (f && fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        CHECK(o != NULL);
        if (strcmp(json_string_value(json_object_get(o, "type")), "summary") == 0)
            v = json_number_value(json_object_get(o, key));
        json_decref(o);
    }
    if (f) fclose(f);
    CHECK(!isnan(v));
    return v;
}

/* training.grad_comm_dtype: bf16 on the shipped fine-tune (2 workers x 16): validation accuracy
 * within 0.01 of fp32 communication, the gradients' bytes halved (the per-step agreement's 40
 * bytes aside), and with zero_stage 1 too (its weights' all-gather stays fp32: 3/4 of the bytes) */
static void test_bf16_comm(void) {
    const char *runs[3] = {"ft-fp32", "ft-bf16", "ft-bf16-zero"};
    double acc[3], sent[3];
    for (int i = 0; i < 3; i++) {
        char rd[1400], dt[64], zs[64];
        snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), runs[i]);
        snprintf(dt, sizeof dt, "training.grad_comm_dtype=%s", i ? "bf16" : "fp32");
        snprintf(zs, sizeof zs, "training.zero_stage=%d", i == 2);
        const char *args[] = {"--config", "configs/finetune.yaml", "--set", rd, "--set", "training.num_workers=2",
                              "--set", "data.batch_size_per_worker=16", "--set", dt, "--set", zs, "--quiet", NULL};
        CHECK_INT_EQ(run_sync(runs[i], args), 0);
        char run[1300];
        snprintf(run, sizeof run, "%s/%s", test_dir(), runs[i]);
        acc[i] = summary_number(run, "val_accuracy");
        sent[i] = summary_number(run, "sent_bytes_per_step");
    }
    printf("fine-tune, 2 workers: val accuracy %.4f (fp32 gradients), %.4f (bf16), %.4f (bf16, zero_stage 1); "
           "bytes sent per step %.0f, %.0f, %.0f\n", acc[0], acc[1], acc[2], sent[0], sent[1], sent[2]);
    CHECK(acc[0] >= 0.9);
    CHECK(fabs(acc[1] - acc[0]) <= 0.01);
    CHECK(fabs(acc[2] - acc[0]) <= 0.01);
    CHECK(sent[1] - 40 == (sent[0] - 40) / 2);
    CHECK(sent[2] - 40 == (sent[0] - 40) * 3 / 4);
}

static void test_doctor(void) {
    const char *args[] = {"doctor", "--num-workers", "3", NULL};
    CHECK_INT_EQ(run_sync("doctor", args), 0);
    char out[1300], text[1 << 14];
    snprintf(out, sizeof out, "%s/doctor.out", test_dir());
    test_slurp(out, text, sizeof text);
    CHECK_STR_CONTAINS(text, "self-test: all-reduce, reduce-scatter and all-gather of parts");
    CHECK_STR_CONTAINS(text, "busbw (GB/s)");
    CHECK_STR_CONTAINS(text, "\nreduce-scatter (sum, float32), 3 workers, shm:\n");
    CHECK_STR_CONTAINS(text, "\nall-gather of parts (float32), 3 workers, shm:\n");
    CHECK_STR_CONTAINS(text, "256 MiB");
    /* the library versions the README promises, and no bandwidth table for one worker */
    CHECK_STR_CONTAINS(text, "  libraries:\n");
    CHECK_STR_CONTAINS(text, "  OpenBLAS  ");
    CHECK_STR_CONTAINS(text, "  libyaml   ");
    const char *one[] = {"doctor", "--num-workers", "1", NULL};
    CHECK_INT_EQ(run_sync("doctor-one", one), 0);
    snprintf(out, sizeof out, "%s/doctor-one.out", test_dir());
    test_slurp(out, text, sizeof text);
    CHECK_STR_CONTAINS(text, "all-reduce bandwidth: not measured with 1 worker");
    CHECK(strstr(text, "busbw") == NULL);
    CHECK(setenv("DTRAIN_TEST_BREAK_ALLREDUCE", "1", 1) == 0);
    int rc = run_sync("doctor-broken", args);
    unsetenv("DTRAIN_TEST_BREAK_ALLREDUCE");
    CHECK_INT_EQ(rc, 1);
    CHECK_STR_CONTAINS(err_text, "self-test failed: all-reduce");
}

int main(void) {
    test_dir_init("multiworker");
    test_equivalence();
    test_bf16_comm();
    test_kill_worker();
    test_stop_worker();
    test_perturbed_replica();
    test_doctor();
    test_dir_remove();
    TEST_PASS("test_multiworker");
}
