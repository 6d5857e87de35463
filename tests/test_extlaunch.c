/* test_extlaunch.c — dtrain started by someone else's launcher, one process per worker:
 *   - two processes with torchrun's variables on 127.0.0.1 (rank 1 started first, so it has
 *     to retry until rank 0 listens) end with weights byte-identical to the fork-mode run;
 *   - the same as a Kubernetes Indexed Job (JOB_COMPLETION_INDEX + training.num_workers);
 *   - a missing rank: rank 0 gives up at the deadline naming it;
 *   - a rank with another config is refused, naming the rank;
 *   - the tcp collective (a ring over loopback) with 2 and 3 ranks; with LoRA adapters (model.lora)
 *     over it and, when built, the mpi collective;
 *   - incomplete, malformed or contradicting variables exit 2 naming them;
 *   - mpirun -np 2 and -np 4 (Open MPI's variables) byte-identical to fork mode; with the mpi
 *     collective (when built) within 1e-5;
 *   - a rank killed in a one-host shm job (3 ranks) or in a hierarchical one (2 "hosts" x 2
 *     ranks: UTS namespaces with their own host names, on this machine's loopback) is noticed by
 *     the others well before training.collective_timeout_s (60 s here), in a message naming it;
 *   - the hierarchical job's two shared-memory segments have names that differ in more than the
 *     leader's rank (neither can be told from the other);
 *   - rank 0 (one host) or a host's leader (hierarchical) killed right after it made the job's
 *     shared memory during the rendezvous leaves no name in /dev/shm;
 *   - training.pipeline_parallel under torchrun (4 ranks, P2 x T2, one host) byte-identical to fork
 *     mode, and under mpirun with the mpi collective (the groups split from MPI_COMM_WORLD) too;
 *   - training.tensor_parallel under torchrun (4 ranks, D2 x T2, one host) byte-identical to fork
 *     mode; over the tcp collective (as across hosts) refused with exit 2;
 *   - nothing is left in /dev/shm.
 * `test_extlaunch CASE` runs one case. */
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "proc.h"
#include "weights.h"
#include "testutil.h"

static char out_text[1 << 18];

/* "NAME=value" pairs, NULL-terminated */
static void set_env(const char *const *pairs) {
    proc_clear_launcher_env();
    for (int i = 0; pairs && pairs[i]; i++) {
        char buf[256];
        snprintf(buf, sizeof buf, "%s", pairs[i]);
        char *eq = strchr(buf, '=');
        CHECK(eq != NULL);
        *eq = '\0';
        CHECK(setenv(buf, eq + 1, 1) == 0);
    }
}

/* dtrain on ci-smoke with 2 x 4 and run.dir=test_dir()/RUN plus extra --set values */
static pid_t start(const char *tag, const char *run, const char *extra_set) {
    static char rd[8][1400];
    static int next;
    char *r = rd[next++ % 8];
    snprintf(r, sizeof rd[0], "run.dir=%s/%s", test_dir(), run);
    const char *args[] = {"--config", "configs/ci-smoke.yaml", "--set", r, "--set", "training.num_workers=2", "--set",
                          "data.batch_size_per_worker=4", "--set", "training.collective_timeout_s=20", "--set",
                          "training.cpu_threads_per_worker=1", "--progress", "never", extra_set ? "--set" : NULL,
                          extra_set, NULL};
    return spawn(tag, args);
}

/* start() with exactly these launcher variables in the environment */
static pid_t start_env(const char *const *env, const char *tag, const char *run, const char *extra_set) {
    set_env(env);
    pid_t p = start(tag, run, extra_set);
    proc_clear_launcher_env();
    return p;
}


static void test_torchrun_style(void) {
    proc_clear_launcher_env();
    CHECK_INT_EQ(wait_exit(start("fork", "fork", NULL), "fork"), 0);
    /* as torchrun under srun starts them: torchrun's variables, torchrun's agent listening on
     * MASTER_PORT (dtrain meets on the next port), and the outer Slurm step's variables
     * (one task) that must not get in the way */
    int agent_port = proc_free_port();
    int agent = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)agent_port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(agent >= 0 && bind(agent, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(agent, 4) == 0);
    char port[32], want[96];
    snprintf(port, sizeof port, "MASTER_PORT=%d", agent_port);
    snprintf(want, sizeof want, "rendezvous at 127.0.0.1:%d\n", agent_port + 1);
    const char *r1[] = {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port,
                        "TORCHELASTIC_RUN_ID=test", "SLURM_STEP_ID=0", "SLURM_PROCID=0", "SLURM_NTASKS=1", NULL};
    const char *r0[] = {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port,
                        "TORCHELASTIC_RUN_ID=test", "SLURM_STEP_ID=0", "SLURM_PROCID=0", "SLURM_NTASKS=1", NULL};
    pid_t p1 = start_env(r1, "torch-r1", "torch", NULL);
    sleep_ms(700); /* rank 0 is late: rank 1 retries */
    pid_t p0 = start_env(r0, "torch-r0", "torch", NULL);
    CHECK_INT_EQ(wait_exit(p0, "torch-r0"), 0);
    CHECK_INT_EQ(wait_exit(p1, "torch-r1"), 0);
    close(agent);
    char path[1300];
    snprintf(path, sizeof path, "%s/torch-r0.out", test_dir());
    test_slurp(path, out_text, sizeof out_text);
    CHECK_STR_CONTAINS(out_text, "dtrain: launched by torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE): rank 0 "
                                 "of 2, local rank 0 of 2; rendezvous at 127.0.0.1:");
    CHECK_STR_CONTAINS(out_text, want);
    CHECK_STR_CONTAINS(out_text, "done: 20 steps");
    snprintf(path, sizeof path, "%s/torch/rank-1.log", test_dir());
    test_slurp(path, out_text, sizeof out_text);
    CHECK_STR_CONTAINS(out_text, "rank 1 of 2, local rank 1 of 2; rendezvous at 127.0.0.1:");
    CHECK_STR_CONTAINS(out_text, "rendezvous took ");
    test_same_weights("fork", "torch");
}

static void test_indexed_job(void) {
    char port[32];
    snprintf(port, sizeof port, "MASTER_PORT=%d", proc_free_port());
    const char *j0[] = {"JOB_COMPLETION_INDEX=0", "MASTER_ADDR=localhost", port, NULL};
    const char *j1[] = {"JOB_COMPLETION_INDEX=1", "MASTER_ADDR=localhost", port, NULL};
    pid_t p0 = start_env(j0, "k8s-0", "k8s", NULL);
    pid_t p1 = start_env(j1, "k8s-1", "k8s", NULL);
    CHECK_INT_EQ(wait_exit(p0, "k8s-0"), 0);
    CHECK_INT_EQ(wait_exit(p1, "k8s-1"), 0);
    char path[1300];
    snprintf(path, sizeof path, "%s/k8s-0.out", test_dir());
    test_slurp(path, out_text, sizeof out_text);
    CHECK_STR_CONTAINS(out_text, "launched by Kubernetes Indexed Job (JOB_COMPLETION_INDEX, world size from "
                                 "training.num_workers): rank 0 of 2");
    test_same_weights("fork", "k8s");
}

static void test_missing_rank(void) {
    char port[32];
    snprintf(port, sizeof port, "MASTER_PORT=%d", proc_free_port());
    const char *r0[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port, NULL};
    pid_t p0 = start_env(r0, "alone", "alone", "training.collective_timeout_s=2");
    CHECK_INT_EQ(wait_exit(p0, "alone"), 1);
    CHECK_STR_CONTAINS(err_text, ": rank(s) 1 did not arrive within 2 s (1 of 2 here;");
    /* and a rank whose rank 0 never comes */
    const char *r1[] = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port, NULL};
    pid_t p1 = start_env(r1, "orphan", "orphan", "training.collective_timeout_s=1");
    CHECK_INT_EQ(wait_exit(p1, "orphan"), 1);
    CHECK_STR_CONTAINS(err_text, "rank 1 could not reach rank 0 at 127.0.0.1:");
}

static void test_other_config(void) {
    char port[32];
    snprintf(port, sizeof port, "MASTER_PORT=%d", proc_free_port());
    const char *r0[] = {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port, NULL};
    const char *r1[] = {"RANK=1", "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port, NULL};
    pid_t p0 = start_env(r0, "cfg-r0", "cfg", NULL);
    pid_t p1 = start_env(r1, "cfg-r1", "cfg", "optimizer.lr=0.002");
    CHECK_INT_EQ(wait_exit(p0, "cfg-r0"), 2);
    CHECK_STR_CONTAINS(err_text, "rank 1 runs another config than rank 0 (config digest ");
    CHECK_INT_EQ(wait_exit(p1, "cfg-r1"), 2);
    CHECK_STR_CONTAINS(err_text, "rank 0 refused rank 1: rank 1 runs another config than rank 0");
}

static void test_env_errors(void) {
    const struct {
        const char *env[6];
        const char *msg;
    } cases[] = {
        {{"RANK=0", NULL}, "environment: RANK is set but WORLD_SIZE is not"},
        {{"RANK=2", "WORLD_SIZE=2", NULL}, "environment: RANK=2 is not below WORLD_SIZE=2"},
        {{"RANK=x", "WORLD_SIZE=2", NULL}, "environment: RANK=\"x\": expected an integer"},
        {{"RANK=0", "WORLD_SIZE=2", "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "MASTER_ADDR=h", NULL},
         "says rank 0 of 2 but OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_SIZE=2 disagree"},
        {{"RANK=1", "WORLD_SIZE=2", "LOCAL_WORLD_SIZE=1", NULL}, "environment: MASTER_ADDR is not set: rank 1 of 2"},
        {{"JOB_COMPLETION_INDEX=5", NULL}, "JOB_COMPLETION_INDEX=5 but training.num_workers is 2"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pid_t p = start_env(cases[i].env, "env", "env", NULL);
        CHECK_INT_EQ(wait_exit(p, "env"), 2);
        CHECK_STR_CONTAINS(err_text, cases[i].msg);
    }
    /* the mpi collective needs processes started by mpirun or srun */
    pid_t pm = start_env(NULL, "env", "env", "training.communication_backend=mpi");
    CHECK_INT_EQ(wait_exit(pm, "env"), 2);
    CHECK_STR_CONTAINS(err_text, "training.communication_backend: mpi needs one dtrain process per worker started by "
                                 "a launcher");
    /* a world of one is not external: dtrain forks its workers as usual */
    const char *one[] = {"RANK=0", "WORLD_SIZE=1", NULL};
    pid_t p = start_env(one, "one", "one", "training.max_steps=3");
    CHECK_INT_EQ(wait_exit(p, "one"), 0);
}

/* mpirun -np N on this machine: the ranks find each other through Open MPI's variables
 * (127.0.0.1, a port from the job id) and end byte-identical to fork mode */
static void test_mpirun(void) {
    const char *mpirun = "/usr/bin/mpirun";
    if (access(mpirun, X_OK) != 0) {
        printf("%s is missing: scripts/test.sh installs openmpi-bin (DTRAIN_TEST_TOOLS=1 scripts/setup.sh)\n", mpirun);
        CHECK(0);
    }
    proc_clear_launcher_env();
    if (getuid() == 0) { /* Open MPI refuses root unless told twice */
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
    const int np[2] = {2, 4};
    for (int i = 0; i < 2; i++) {
        char tag[32], nw[64], bs[64], rd[1400], n[8];
        snprintf(n, sizeof n, "%d", np[i]);
        snprintf(nw, sizeof nw, "training.num_workers=%d", np[i]);
        snprintf(bs, sizeof bs, "data.batch_size_per_worker=%d", 8 / np[i]);
        /* fork mode with the same world */
        snprintf(tag, sizeof tag, "fork%d", np[i]);
        snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), tag);
        const char *fargs[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", nw, "--set", bs, "--progress",
                               "never", NULL};
        CHECK_INT_EQ(wait_exit(spawn(tag, fargs), tag), 0);
        snprintf(tag, sizeof tag, "mpi%d", np[i]);
        snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), tag);
        const char *margs[] = {"-np", n, "--oversubscribe", DTRAIN_BIN, "--config", "configs/ci-smoke.yaml", "--set", rd,
                               "--set", nw, "--set", bs, "--progress", "never", NULL};
        CHECK_INT_EQ(wait_exit(spawn_prog(tag, mpirun, margs), tag), 0);
        char path[1300];
        snprintf(path, sizeof path, "%s/%s.out", test_dir(), tag);
        test_slurp(path, out_text, sizeof out_text);
        CHECK_STR_CONTAINS(out_text, "launched by Open MPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE): rank 0");
        char fork_tag[32];
        snprintf(fork_tag, sizeof fork_tag, "fork%d", np[i]);
        test_same_weights(fork_tag, tag);
#ifdef DTRAIN_TEST_HAVE_MPI
        /* the mpi collective: MPI sums in its own order, so within 1e-5 rather than bit for bit */
        snprintf(tag, sizeof tag, "mpibe%d", np[i]);
        snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), tag);
        const char *bargs[] = {"-np", n, "--oversubscribe", DTRAIN_BIN, "--config", "configs/ci-smoke.yaml", "--set", rd,
                               "--set", nw, "--set", bs, "--set", "training.communication_backend=mpi", "--progress",
                               "never", NULL};
        CHECK_INT_EQ(wait_exit(spawn_prog(tag, mpirun, bargs), tag), 0);
        snprintf(path, sizeof path, "%s/%s.out", test_dir(), tag);
        test_slurp(path, out_text, sizeof out_text);
        CHECK_STR_CONTAINS(out_text, "; the mpi collective\n");
        CHECK_STR_CONTAINS(out_text, "workers x 1 threads, mpi all-reduce");
        CHECK(run_distance(tag, fork_tag) <= 1e-5);
        /* and with the AdamW state sharded: MPI's reduce-scatter and all-gather of parts */
        snprintf(tag, sizeof tag, "mpizero%d", np[i]);
        snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), tag);
        const char *zargs[] = {"-np", n, "--oversubscribe", DTRAIN_BIN, "--config", "configs/ci-smoke.yaml", "--set", rd,
                               "--set", nw, "--set", bs, "--set", "training.communication_backend=mpi", "--set",
                               "training.zero_stage=1", "--progress", "never", NULL};
        CHECK_INT_EQ(wait_exit(spawn_prog(tag, mpirun, zargs), tag), 0);
        snprintf(path, sizeof path, "%s/%s.out", test_dir(), tag);
        test_slurp(path, out_text, sizeof out_text);
        CHECK_STR_CONTAINS(out_text, "workers x 1 threads, mpi reduce-scatter + all-gather");
        printf("%s vs %s: weights rel L2 distance %.2e\n", tag, fork_tag, run_distance(tag, fork_tag));
        CHECK(run_distance(tag, fork_tag) <= 1e-5);
        /* bf16 gradients through MPI's custom bf16 sum, sharded and not: every rank the same bits
         * (the replica check every 5 steps), the weights near the fp32 run's */
        for (int z = 0; z < 2; z++) {
            snprintf(tag, sizeof tag, "mpibf16%s%d", z ? "z" : "", np[i]);
            snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), tag);
            const char *hargs[] = {"-np", n, "--oversubscribe", DTRAIN_BIN, "--config", "configs/ci-smoke.yaml", "--set",
                                   rd, "--set", nw, "--set", bs, "--set", "training.communication_backend=mpi", "--set",
                                   "training.grad_comm_dtype=bf16", "--set", z ? "training.zero_stage=1" : "training.zero_stage=0",
                                   "--set", "training.check_replicas_every=5", "--progress", "never", NULL};
            CHECK_INT_EQ(wait_exit(spawn_prog(tag, mpirun, hargs), tag), 0);
            printf("%s vs %s: weights rel L2 distance %.2e\n", tag, fork_tag, run_distance(tag, fork_tag));
            CHECK(run_distance(tag, fork_tag) <= 2e-2);
        }
#endif
    }
    unsetenv("OMPI_ALLOW_RUN_AS_ROOT");
    unsetenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM");
}

/* the tcp collective on this host (training.communication_backend: tcp): a ring over
 * loopback; 2 ranks byte-identical to fork mode, 3 ranks (uneven chunks) within 1e-5, and the
 * replica check (every 5 steps) proves every rank holds the same bits; the same with the AdamW
 * state sharded (training.zero_stage 1: the ring's reduce-scatter and all-gather of parts) */
static void test_tcp_ring(void) {
    for (int w = 2; w <= 3; w++) {
        char nw[64], bs[64], fork_run[32], port[32], ws[32];
        snprintf(nw, sizeof nw, "training.num_workers=%d", w);
        snprintf(bs, sizeof bs, "data.batch_size_per_worker=%d", w == 2 ? 4 : 2);
        snprintf(fork_run, sizeof fork_run, "tcpref%d", w);
        char rd[1400];
        snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), fork_run);
        const char *fargs[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", nw, "--set", bs, "--set",
                               "training.cpu_threads_per_worker=1", "--progress", "never", NULL};
        proc_clear_launcher_env();
        CHECK_INT_EQ(wait_exit(spawn(fork_run, fargs), fork_run), 0);
        for (int z = 0; z < 2; z++) {
            char tcp_run[32], zs[32];
            snprintf(tcp_run, sizeof tcp_run, "tcp%d%s", w, z ? "-zero" : "");
            snprintf(zs, sizeof zs, "training.zero_stage=%d", z);
            snprintf(port, sizeof port, "MASTER_PORT=%d", proc_free_port());
            snprintf(ws, sizeof ws, "WORLD_SIZE=%d", w);
            snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), tcp_run);
            pid_t pids[3];
            for (int r = w - 1; r >= 0; r--) {
                char rank[32], tag[40];
                snprintf(rank, sizeof rank, "RANK=%d", r);
                snprintf(tag, sizeof tag, "%s-r%d", tcp_run, r);
                const char *env[] = {rank, ws, "MASTER_ADDR=127.0.0.1", port, NULL};
                const char *args[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", nw, "--set", bs,
                                      "--set", "training.cpu_threads_per_worker=1", "--set",
                                      "training.communication_backend=tcp", "--set", "training.check_replicas_every=5",
                                      "--set", "training.collective_timeout_s=20", "--set", zs, "--progress", "never",
                                      NULL};
                set_env(env);
                pids[r] = spawn(tag, args);
                proc_clear_launcher_env();
            }
            for (int r = 0; r < w; r++) {
                char tag[40];
                snprintf(tag, sizeof tag, "%s-r%d", tcp_run, r);
                CHECK_INT_EQ(wait_exit(pids[r], tag), 0);
            }
            char path[1300];
            snprintf(path, sizeof path, "%s/%s-r0.out", test_dir(), tcp_run);
            test_slurp(path, out_text, sizeof out_text);
            CHECK_STR_CONTAINS(out_text, z ? "x 1 threads, tcp reduce-scatter + all-gather" : "x 1 threads, tcp all-reduce");
            double dist = run_distance(tcp_run, fork_run);
            printf("%s vs %s: weights rel L2 distance %.2e\n", tcp_run, fork_run, dist);
            CHECK(w == 2 ? dist == 0.0 : dist <= 1e-5);
        }
    }
}

/* model.lora over the tcp ring (2 ranks: byte-identical to fork mode, as without adapters) and,
 * when built, the mpi collective under mpirun (within 1e-5): the adapters' buckets, the
 * embeddings' one empty, go through every collective as a model's do */
static void test_lora_collectives(void) {
    proc_clear_launcher_env();
    CHECK_INT_EQ(wait_exit(start("lora-fork", "lora-fork", "model.lora.rank=4"), "lora-fork"), 0);
    char port[32], rd[1400];
    snprintf(port, sizeof port, "MASTER_PORT=%d", proc_free_port());
    snprintf(rd, sizeof rd, "run.dir=%s/lora-tcp", test_dir());
    pid_t pids[2];
    for (int r = 1; r >= 0; r--) {
        char rank[32], tag[40];
        snprintf(rank, sizeof rank, "RANK=%d", r);
        snprintf(tag, sizeof tag, "lora-tcp-r%d", r);
        const char *env[] = {rank, "WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", port, NULL};
        const char *args[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", "training.num_workers=2", "--set",
                              "data.batch_size_per_worker=4", "--set", "training.cpu_threads_per_worker=1", "--set",
                              "training.communication_backend=tcp", "--set", "training.check_replicas_every=5", "--set",
                              "training.collective_timeout_s=20", "--set", "model.lora.rank=4", "--progress", "never",
                              NULL};
        set_env(env);
        pids[r] = spawn(tag, args);
        proc_clear_launcher_env();
    }
    CHECK_INT_EQ(wait_exit(pids[0], "lora-tcp-r0"), 0);
    CHECK_INT_EQ(wait_exit(pids[1], "lora-tcp-r1"), 0);
    char path[1300];
    snprintf(path, sizeof path, "%s/lora-tcp-r0.out", test_dir());
    test_slurp(path, out_text, sizeof out_text);
    CHECK_STR_CONTAINS(out_text, "x 1 threads, tcp all-reduce");
    test_same_weights("lora-fork", "lora-tcp");
#ifdef DTRAIN_TEST_HAVE_MPI
    if (getuid() == 0) {
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
    snprintf(rd, sizeof rd, "run.dir=%s/lora-mpi", test_dir());
    const char *margs[] = {"-np", "2", "--oversubscribe", DTRAIN_BIN, "--config", "configs/ci-smoke.yaml", "--set", rd,
                           "--set", "training.num_workers=2", "--set", "data.batch_size_per_worker=4", "--set",
                           "training.communication_backend=mpi", "--set", "model.lora.rank=4", "--progress", "never", NULL};
    CHECK_INT_EQ(wait_exit(spawn_prog("lora-mpi", "/usr/bin/mpirun", margs), "lora-mpi"), 0);
    CHECK(run_distance("lora-mpi", "lora-fork") <= 1e-5); /* it prints the distance */
    unsetenv("OMPI_ALLOW_RUN_AS_ROOT");
    unsetenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM");
#endif
}

/* our names in /dev/shm (other programs' come and go) */
static int count_dtrain_shm(void) {
    DIR *d = opendir("/dev/shm");
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strncmp(e->d_name, "dtrain-", 7) == 0;
    closedir(d);
    return n;
}

/* ---- ranks that die ---- */

static pid_t g_live[16]; /* started by the cases below and not reaped yet: killed if a CHECK fails */

static void kill_live(void) {
    for (int i = 0; i < 16; i++)
        if (g_live[i] > 0) {
            kill(g_live[i], SIGKILL);
            waitpid(g_live[i], NULL, 0);
            g_live[i] = 0;
        }
}

static void live_add(pid_t p) {
    for (int i = 0; i < 16; i++)
        if (g_live[i] <= 0) {
            g_live[i] = p;
            return;
        }
    CHECK(0);
}

static int reap(pid_t p, const char *tag) {
    int rc = wait_exit(p, tag);
    for (int i = 0; i < 16; i++)
        if (g_live[i] == p) g_live[i] = 0;
    return rc;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* the flags that give `unshare` a UTS namespace here (root: --uts; else a user namespace too), or
 * NULL when it cannot: the cases with two "hosts" are skipped then */
static const char *const *uts_flags(void) {
    static const char *const root[] = {"--uts", NULL}, *user[] = {"-U", "-r", "--uts", NULL};
    const char *const *f = geteuid() == 0 ? root : user;
    char cmd[128] = "/usr/bin/unshare";
    for (int i = 0; f[i]; i++) snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " %s", f[i]);
    snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " true 2>/dev/null");
    if (access("/usr/bin/unshare", X_OK) != 0 || system(cmd) != 0) return NULL;
    return f;
}

static const char *g_secret; /* "DTRAIN_RDZV_SECRET=..." for the ranks start_rank starts, or NULL */

/* Rank r of `world` as torchrun starts it (LOCAL_RANK r % lw of lw) at 127.0.0.1:port, run dir
 * RUN, collective_timeout_s 60 and `steps` steps; `host` NULL: on this host, else in a UTS
 * namespace of its own with the host name dtrain-host-HOST. The pid is that of dtrain itself.
 * No evaluation, checkpoints nor replica checks: the steps' collectives are the gradients' only
 * (a hierarchical job's all-gathers go over the flat tcp ring, which notices a death itself). */
static pid_t start_rank(const char *tag, const char *run, int r, int world, int lw, int port, const char *host,
                        int steps) {
    char env[5][48], rd[1400], nw[64], ms[64], hn[64];
    snprintf(env[0], sizeof env[0], "RANK=%d", r);
    snprintf(env[1], sizeof env[1], "WORLD_SIZE=%d", world);
    snprintf(env[2], sizeof env[2], "LOCAL_RANK=%d", r % lw);
    snprintf(env[3], sizeof env[3], "LOCAL_WORLD_SIZE=%d", lw);
    snprintf(env[4], sizeof env[4], "MASTER_PORT=%d", port);
    const char *vars[] = {env[0], env[1], env[2], env[3], env[4], "MASTER_ADDR=127.0.0.1", g_secret, NULL};
    snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), run);
    snprintf(nw, sizeof nw, "training.num_workers=%d", world);
    snprintf(ms, sizeof ms, "training.max_steps=%d", steps);
    snprintf(hn, sizeof hn, "dtrain-host-%s", host ? host : "");
    const char *args[48];
    int n = 0;
    const char *const *flags = host ? uts_flags() : NULL;
    for (int i = 0; flags && flags[i]; i++) args[n++] = flags[i];
    if (host) {
        const char *sh[] = {"sh", "-c", "hostname \"$0\" && exec \"$@\"", hn, DTRAIN_BIN};
        for (int i = 0; i < 5; i++) args[n++] = sh[i];
    }
    const char *rest[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", nw, "--set",
                          "data.batch_size_per_worker=2", "--set", "training.collective_timeout_s=60", "--set",
                          "training.cpu_threads_per_worker=1", "--set", ms, "--set", "eval.every_steps=0", "--set",
                          "checkpoint.every_steps=0", "--set", "training.check_replicas_every=0", "--progress",
                          "never", NULL};
    for (int i = 0; rest[i]; i++) args[n++] = rest[i];
    args[n] = NULL;
    set_env(vars);
    pid_t p = host ? spawn_prog(tag, "/usr/bin/unshare", args) : spawn(tag, args);
    proc_clear_launcher_env();
    live_add(p);
    return p;
}

/* until RUN/metrics.jsonl records step `step` (rank 0 trains), at most 120 s */
static void wait_for_step(const char *run, int step) {
    char path[1300], want[32];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", test_dir(), run);
    snprintf(want, sizeof want, "\"step\":%d,", step);
    for (double t0 = now_s(); now_s() - t0 < 120; sleep_ms(20)) {
        test_slurp(path, out_text, sizeof out_text);
        if (strstr(out_text, want)) return;
    }
    printf("%s: no step %d within 120 s\n", run, step);
    CHECK(0);
}

/* Ranks 0..world-1 (hosts: NULL, one host; else hosts[r] for rank r) train; rank `victim` is killed
 * (SIGKILL) once they do: every other rank fails well before training.collective_timeout_s (60 s),
 * and one of them names the victim: one on its host as gone (shared memory), or, when the kill
 * came in one of the flat tcp ring's collectives (a hierarchical job's per-step agreement), as
 * its ring neighbour. */
static void kill_one(const char *run, int world, int lw, const char *const *hosts, int victim) {
    int port = proc_free_port();
    pid_t p[8];
    char tags[8][48];
    for (int r = world - 1; r >= 0; r--) {
        snprintf(tags[r], sizeof tags[r], "%s-r%d", run, r);
        p[r] = start_rank(tags[r], run, r, world, lw, port, hosts ? hosts[r] : NULL, 100000);
    }
    wait_for_step(run, 5);
    const double t0 = now_s();
    CHECK(kill(p[victim], SIGKILL) == 0);
    char gone[96], closed[64], reset[64];
    snprintf(gone, sizeof gone, "rank %d (pid %ld on this host) exited or was killed", victim, (long)p[victim]);
    snprintf(closed, sizeof closed, "rank %d closed the connection", victim);
    snprintf(reset, sizeof reset, "sending to rank %d failed", victim);
    int named = 0;
    for (int r = 0; r < world; r++) {
        if (r == victim) continue;
        CHECK(reap(p[r], tags[r]) != 0);
        double dt = now_s() - t0;
        printf("%s: rank %d failed %.2f s after rank %d was killed\n", run, r, dt, victim);
        CHECK(dt < 20.0); /* collective_timeout_s is 60 */
        named += strstr(err_text, gone) || strstr(err_text, closed) || strstr(err_text, reset);
    }
    CHECK(named > 0);
    CHECK_INT_EQ(reap(p[victim], tags[victim]), 128 + SIGKILL);
}

/* one host, the job's shared memory: rank 1 of 3 killed mid-training */
static void test_dead_rank_shm(void) {
    kill_one("dead-shm", 3, 3, NULL, 1);
    char path[1300]; /* no tcp ring here: both name it as gone */
    for (int r = 0; r <= 2; r += 2) {
        snprintf(path, sizeof path, "%s/dead-shm-r%d.err", test_dir(), r);
        test_slurp(path, out_text, sizeof out_text);
        CHECK_STR_CONTAINS(out_text, "rank 1 (pid ");
        CHECK_STR_CONTAINS(out_text, "on this host) exited or was killed while rank ");
    }
}

static const char *const g_hosts[] = {"A", "A", "B", "B"};

/* two hosts x two ranks, the hierarchical collective: a host's second rank, then a leader */
static void test_dead_rank_hier(void) {
    if (!uts_flags()) {
        printf("dead_rank_hier: skipped: unshare cannot make a UTS namespace here\n");
        return;
    }
    kill_one("dead-hier3", 4, 2, g_hosts, 3);
    char path[1300];
    snprintf(path, sizeof path, "%s/dead-hier3-r0.out", test_dir());
    test_slurp(path, out_text, sizeof out_text);
    CHECK_STR_CONTAINS(out_text, "gradients hierarchical: 2 hosts x 2 ranks");
    kill_one("dead-hier2", 4, 2, g_hosts, 2);
}

/* the names inotify reports created in /dev/shm that hold "-PORT-" (this job's) */
typedef struct shm_names {
    int fd, port, n;
    char name[8][256];
} shm_names;

static void shm_watch(shm_names *w, int port) {
    memset(w, 0, sizeof *w);
    w->port = port;
    w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    CHECK(w->fd >= 0);
    CHECK(inotify_add_watch(w->fd, "/dev/shm", IN_CREATE) >= 0);
}

/* reads what inotify has (waiting up to ms); the index of the first new name holding `part`, or -1 */
static int shm_poll(shm_names *w, int ms, const char *part) {
    struct pollfd pf = {.fd = w->fd, .events = POLLIN};
    if (poll(&pf, 1, ms) <= 0) return -1;
    char buf[8192] __attribute__((aligned(8)));
    ssize_t got = read(w->fd, buf, sizeof buf);
    int hit = -1;
    char port[24];
    snprintf(port, sizeof port, "-%d-", w->port);
    for (ssize_t off = 0; got > 0 && off < got;) {
        const struct inotify_event *ev = (const struct inotify_event *)(buf + off);
        off += (ssize_t)sizeof *ev + ev->len;
        if (!ev->len || strncmp(ev->name, "dtrain-", 7) != 0 || !strstr(ev->name, port) || w->n >= 8) continue;
        snprintf(w->name[w->n], sizeof w->name[0], "%s", ev->name);
        printf("created in /dev/shm: %s\n", ev->name);
        if (hit < 0 && (!part || strstr(ev->name, part))) hit = w->n;
        w->n++;
    }
    return hit;
}

/* every name seen is gone */
static void shm_check_gone(shm_names *w) {
    for (int i = 0; i < w->n; i++) {
        char path[300];
        snprintf(path, sizeof path, "/dev/shm/%s", w->name[i]);
        if (access(path, F_OK) == 0) printf("left in /dev/shm: %s\n", w->name[i]);
        CHECK(access(path, F_OK) != 0);
    }
    close(w->fd);
}

static void hier_names_run(const char *run) {
    int port = proc_free_port();
    shm_names w;
    shm_watch(&w, port);
    pid_t p[4];
    char tags[4][48];
    for (int r = 3; r >= 0; r--) {
        snprintf(tags[r], sizeof tags[r], "%s-r%d", run, r);
        p[r] = start_rank(tags[r], run, r, 4, 2, port, g_hosts[r], 20);
    }
    for (int r = 0; r < 4; r++) CHECK_INT_EQ(reap(p[r], tags[r]), 0);
    while (shm_poll(&w, 0, NULL) >= 0) {
    }
    CHECK_INT_EQ(w.n, 2);
    /* without "-hN" (the leader's rank) the names still differ */
    const char *a = w.name[0], *b = w.name[1], *pa = strstr(a, "-h"), *pb = strstr(b, "-h");
    CHECK(pa && pb);
    char sa[256], sb[256];
    snprintf(sa, sizeof sa, "%.*s%s", (int)(pa - a), a, pa + 3);
    snprintf(sb, sizeof sb, "%.*s%s", (int)(pb - b), b, pb + 3);
    printf("without the leaders' ranks: %s and %s\n", sa, sb);
    CHECK(strcmp(sa, sb) != 0);
    shm_check_gone(&w);
}

/* a hierarchical job that trains: its hosts' segments (one each) have names that differ in more
 * than the leader's rank: neither can be told from the other; without a shared secret, then
 * with one (the names through HMAC) */
static void test_hier_names(void) {
    if (!uts_flags()) {
        printf("hier_names: skipped: unshare cannot make a UTS namespace here\n");
        return;
    }
    hier_names_run("names");
    g_secret = "DTRAIN_RDZV_SECRET=extlaunch-test-secret-0123456789";
    hier_names_run("names-secret");
    g_secret = NULL;
}

/* The creator of a segment (`victim`: rank 0 on one host, a leader in a hierarchical job) is
 * killed as soon as the segment `part` appears in /dev/shm: the other ranks fail, and no name of
 * the job is left behind. */
static void kill_creator(const char *run, int world, int lw, const char *const *hosts, int victim, const char *part) {
    int port = proc_free_port();
    shm_names w;
    shm_watch(&w, port);
    pid_t p[8];
    char tags[8][48];
    for (int r = world - 1; r >= 0; r--) {
        snprintf(tags[r], sizeof tags[r], "%s-r%d", run, r);
        p[r] = start_rank(tags[r], run, r, world, lw, port, hosts ? hosts[r] : NULL, 100000);
    }
    int hit = -1;
    for (double t0 = now_s(); hit < 0 && now_s() - t0 < 60;) hit = shm_poll(&w, 100, part);
    CHECK(hit >= 0);
    CHECK(kill(p[victim], SIGKILL) == 0);
    for (int r = 0; r < world; r++) CHECK(reap(p[r], tags[r]) != 0);
    while (shm_poll(&w, 0, NULL) >= 0) {
    }
    shm_check_gone(&w);
}

static void test_creator_killed_shm(void) { kill_creator("creator-shm", 2, 2, NULL, 0, NULL); }

static void test_creator_killed_hier(void) {
    if (!uts_flags()) {
        printf("creator_killed_hier: skipped: unshare cannot make a UTS namespace here\n");
        return;
    }
    kill_creator("creator-hier", 4, 2, g_hosts, 2, "-h2");
}

#define TP_ARGS(rd) \
    "--config", "configs/ci-smoke.yaml", "--set", rd, "--set", "training.num_workers=4", "--set", \
        "data.batch_size_per_worker=4", "--set", "training.tensor_parallel=2", "--set", "model.n_head=4", "--set", \
        "model.n_embd=64", "--set", "model.n_layer=2", "--set", "training.collective_timeout_s=20", "--set", \
        "training.cpu_threads_per_worker=1", "--progress", "never"

/* `world` ranks with torchrun's variables (tags PREFIX-rN) of the tensor-parallel run in rd, plus
 * `extra` and `extra2` (--set; may be NULL); each must exit `want` (err_text: the last one's stderr) */
static void torchrun_tp(const char *prefix, int world, const char *rd, const char *extra, const char *extra2, int want) {
    char port[32], ws[32];
    snprintf(port, sizeof port, "MASTER_PORT=%d", proc_free_port());
    snprintf(ws, sizeof ws, "WORLD_SIZE=%d", world);
    char lws[40];
    snprintf(lws, sizeof lws, "LOCAL_WORLD_SIZE=%d", world);
    pid_t p[8];
    char tags[8][48];
    for (int r = 0; r < world; r++) {
        char rank[32], local[32];
        snprintf(rank, sizeof rank, "RANK=%d", r);
        snprintf(local, sizeof local, "LOCAL_RANK=%d", r);
        snprintf(tags[r], sizeof tags[r], "%s-r%d", prefix, r);
        const char *env[] = {rank, ws, local, lws, "MASTER_ADDR=127.0.0.1", port, g_secret, NULL};
        set_env(env);
        const char *args[] = {TP_ARGS(rd), extra ? "--set" : NULL, extra, extra2 ? "--set" : NULL, extra2, NULL};
        p[r] = spawn(tags[r], args);
        proc_clear_launcher_env();
    }
    for (int r = 0; r < world; r++) CHECK_INT_EQ(wait_exit(p[r], tags[r]), want);
}

/* training.tensor_parallel under torchrun on one host: 4 ranks as D2 x T2 (the groups' shared memory
 * made by rank 0 under random names, removed once mapped) end on the fork-mode run's bytes; so do
 * the same config and P2 x T2 over the tcp collective (as across hosts: each group a ring of TCP
 * connections proved with the rendezvous' secret; groups of two, whose sums are exact in any
 * order). */
static void test_tensor_parallel(void) {
    static char rd[2][1400];
    const char *runs[2] = {"tp-fork", "tp-torch"};
    for (int i = 0; i < 2; i++) snprintf(rd[i], sizeof rd[i], "run.dir=%s/%s", test_dir(), runs[i]);
    const char *fork_args[] = {TP_ARGS(rd[0]), NULL};
    proc_clear_launcher_env();
    CHECK_INT_EQ(wait_exit(spawn("tp-fork", fork_args), "tp-fork"), 0);
    torchrun_tp("tp-torch", 4, rd[1], NULL, NULL, 0);
    test_same_weights("tp-fork", "tp-torch");
    /* the tcp collective stands for ranks on several hosts: each group its own ring */
    static char td[2][1400];
    snprintf(td[0], sizeof td[0], "run.dir=%s/tp-tcp", test_dir());
    snprintf(td[1], sizeof td[1], "run.dir=%s/pp-tcp", test_dir());
    g_secret = "DTRAIN_RDZV_SECRET=tensor-parallel-test-secret-0123"; /* the groups' rings prove themselves with it */
    torchrun_tp("tp-tcp", 4, td[0], "training.communication_backend=tcp", NULL, 0);
    test_same_weights("tp-fork", "tp-tcp");
    static char log[1 << 16], path[1500];
    snprintf(path, sizeof path, "%s/tp-tcp/train.log", test_dir());
    test_slurp(path, log, sizeof log);
    CHECK_STR_CONTAINS(log, "each layer sums its activations twice forward and twice backward over tcp");
    /* pipeline stages too: P2 x T2 under torchrun, byte-identical to fork mode */
    static char pd[2][1400];
    const char *pruns[2] = {"pp-fork", "pp-torch"};
    for (int i = 0; i < 2; i++) snprintf(pd[i], sizeof pd[i], "run.dir=%s/%s", test_dir(), pruns[i]);
    const char *pfork[] = {TP_ARGS(pd[0]), "--set", "training.pipeline_parallel=2", NULL};
    CHECK_INT_EQ(wait_exit(spawn("pp-fork", pfork), "pp-fork"), 0);
    torchrun_tp("pp-torch", 4, pd[1], "training.pipeline_parallel=2", NULL, 0);
    test_same_weights("pp-fork", "pp-torch");
    torchrun_tp("pp-tcp", 4, td[1], "training.pipeline_parallel=2", "training.communication_backend=tcp", 0);
    g_secret = NULL;
    test_same_weights("pp-fork", "pp-tcp");
#ifdef DTRAIN_TEST_HAVE_MPI
    /* and under mpirun with the mpi collective, whose groups are communicators split from the
     * job's (what ranks on several hosts use): the same bits (sums of two are exact either way) */
    proc_clear_launcher_env();
    if (getuid() == 0) { /* Open MPI refuses root unless told twice */
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    }
    static char md[1400];
    snprintf(md, sizeof md, "run.dir=%s/pp-mpi", test_dir());
    const char *margs[] = {"-np", "4", "--oversubscribe", DTRAIN_BIN, TP_ARGS(md), "--set", "training.pipeline_parallel=2",
                           "--set", "training.communication_backend=mpi", NULL};
    CHECK_INT_EQ(wait_exit(spawn_prog("pp-mpi", "/usr/bin/mpirun", margs), "pp-mpi"), 0);
    test_same_weights("pp-fork", "pp-mpi");
#endif
}
#undef TP_ARGS

/* every case, or the one named on the command line */
int main(int argc, char **argv) {
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {{"env_errors", test_env_errors},     {"torchrun_style", test_torchrun_style},
                 {"indexed_job", test_indexed_job},   {"missing_rank", test_missing_rank},
                 {"other_config", test_other_config}, {"tcp_ring", test_tcp_ring},
                 {"lora_collectives", test_lora_collectives},
                 {"mpirun", test_mpirun},             {"dead_rank_shm", test_dead_rank_shm},
                 {"dead_rank_hier", test_dead_rank_hier}, {"hier_names", test_hier_names},
                 {"creator_killed_shm", test_creator_killed_shm}, {"creator_killed_hier", test_creator_killed_hier},
                 {"tensor_parallel", test_tensor_parallel}};
    test_dir_init("extlaunch");
    atexit(kill_live);
    int shm_before = count_dtrain_shm();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (argc < 2 || strcmp(argv[1], cases[i].name) == 0) {
            printf("--- %s\n", cases[i].name);
            cases[i].fn();
        }
    CHECK_INT_EQ(count_dtrain_shm(), shm_before);
    test_dir_remove();
    TEST_PASS("test_extlaunch");
}
