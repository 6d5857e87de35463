/* test_slurm.c — a real single-host Slurm (slurmctld, slurmd and munge from Debian, started
 * here with a config of their own in the test dir): `srun -n 2 dtrain ...` and
 * `sbatch --wait scripts/slurm/dtrain.sbatch ...` each run two ranks that find each other
 * from Slurm's variables and end byte-identical to dtrain's fork mode.
 *
 * Needs root; exits 77 (skipped) without it, and fails when Slurm or munge is missing
 * (scripts/test.sh installs slurm-wlm and munge). Stops every daemon it started. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "proc.h"
#include "testutil.h"

static char pidfiles[3][1300];

/* SIGTERM to every daemon we started, then wait (up to 10 s) until they are gone */
static void stop_daemons(void) {
    long pids[3] = {0};
    for (int i = 0; i < 3; i++) {
        char buf[64] = "";
        if (!pidfiles[i][0]) continue;
        test_slurp(pidfiles[i], buf, sizeof buf);
        pids[i] = atol(buf);
        if (pids[i] > 1) kill((pid_t)pids[i], SIGTERM);
    }
    for (int t = 0; t < 100; t++) {
        int left = 0;
        for (int i = 0; i < 3; i++) left += pids[i] > 1 && kill((pid_t)pids[i], 0) == 0;
        if (!left) break;
        sleep_ms(100);
    }
}

static void run_cmd(const char *cmd) {
    printf("$ %s\n", cmd);
    CHECK_INT_EQ(system(cmd), 0);
}


int main(void) {
    test_dir_init("slurm");
    if (getuid() != 0) {
        printf("test_slurm: skipped: needs root to start slurmctld, slurmd and munged\n");
        return 77;
    }
    const char *need[] = {"/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "/usr/bin/srun", NULL};
    for (int i = 0; need[i]; i++)
        if (access(need[i], X_OK) != 0) {
            printf("test_slurm: %s is missing (scripts/test.sh installs slurm-wlm and munge)\n", need[i]);
            return 1;
        }
    const char *d = test_dir();
    char host[256];
    CHECK(gethostname(host, sizeof host) == 0);
    host[strcspn(host, ".")] = '\0';
    int port = 17000 + (int)(getpid() % 2000) * 2;

    /* munge with a key and socket of its own */
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s/munge' '%s/state' '%s/spool' && dd if=/dev/urandom of='%s/munge/key' bs=1024 count=1 "
             "2>/dev/null && chmod 700 '%s/munge' && chmod 600 '%s/munge/key' && "
             "munged --force --key-file='%s/munge/key' --socket='%s/munge/socket' --pid-file='%s/munge/pid' "
             "--log-file='%s/munge/log' --seed-file='%s/munge/seed'",
             d, d, d, d, d, d, d, d, d, d, d);
    snprintf(pidfiles[0], sizeof pidfiles[0], "%s/munge/pid", d);
    snprintf(pidfiles[1], sizeof pidfiles[1], "%s/slurmctld.pid", d);
    snprintf(pidfiles[2], sizeof pidfiles[2], "%s/slurmd.pid", d);
    atexit(stop_daemons);
    run_cmd(cmd);

    char conf[1300], text[4096];
    snprintf(conf, sizeof conf, "%s/slurm.conf", d);
    int n = snprintf(text, sizeof text,
                     "ClusterName=dtraintest\nSlurmctldHost=%s\nSlurmctldPort=%d\nSlurmdPort=%d\n"
                     "AuthType=auth/munge\nAuthInfo=socket=%s/munge/socket\nSlurmUser=root\nSlurmdUser=root\n"
                     "StateSaveLocation=%s/state\nSlurmdSpoolDir=%s/spool\nSlurmctldPidFile=%s\nSlurmdPidFile=%s\n"
                     "SlurmctldLogFile=%s/slurmctld.log\nSlurmdLogFile=%s/slurmd.log\n"
                     "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nSelectType=select/cons_tres\n"
                     "SelectTypeParameters=CR_Core\nMpiDefault=none\nReturnToService=2\n"
                     "NodeName=%s CPUs=2 State=UNKNOWN\n"
                     "PartitionName=debug Nodes=%s Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n",
                     host, port, port + 1, d, d, d, pidfiles[1], pidfiles[2], d, d, host, host);
    test_write_file(conf, text, (size_t)n);
    CHECK(setenv("SLURM_CONF", conf, 1) == 0);
    snprintf(cmd, sizeof cmd, "slurmctld -f '%s' && sleep 1 && slurmd -f '%s'", conf, conf);
    run_cmd(cmd);
    int idle = 0;
    for (int i = 0; i < 100 && !idle; i++) { /* up to 20 s for the node to register */
        sleep_ms(200);
        FILE *p = popen("sinfo -h -o %t 2>/dev/null", "r");
        char st[64] = "";
        if (p) {
            if (!fgets(st, sizeof st, p)) st[0] = '\0';
            pclose(p);
        }
        idle = strncmp(st, "idle", 4) == 0;
    }
    if (!idle) {
        snprintf(cmd, sizeof cmd, "tail -20 '%s/slurmctld.log' '%s/slurmd.log'", d, d);
        if (system(cmd) != 0) printf("(no logs)\n");
    }
    CHECK(idle);

    /* the reference: dtrain forks 2 workers */
    char rd[1400];
    snprintf(rd, sizeof rd, "run.dir=%s/fork", d);
    const char *fargs[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", "training.num_workers=2", "--set",
                           "data.batch_size_per_worker=4", "--set", "training.cpu_threads_per_worker=1", "--progress",
                           "never", NULL};
    CHECK_INT_EQ(wait_exit(spawn("fork", fargs), "fork"), 0);

    /* srun -n 2: two ranks from SLURM_PROCID / SLURM_NTASKS inside the step */
    snprintf(rd, sizeof rd, "run.dir=%s/srun", d);
    const char *sargs[] = {"-n", "2", DTRAIN_BIN, "--config", "configs/ci-smoke.yaml", "--set", rd, "--set",
                           "training.num_workers=2", "--set", "data.batch_size_per_worker=4", "--set",
                           "training.cpu_threads_per_worker=1", "--progress", "never", NULL};
    /* the rendezvous secret from the environment srun was started in: srun passes it to every task */
    setenv("DTRAIN_RDZV_SECRET", "slurm-test-secret-0123456789", 1);
    CHECK_INT_EQ(wait_exit(spawn_prog("srun", "/usr/bin/srun", sargs), "srun"), 0);
    unsetenv("DTRAIN_RDZV_SECRET");
    CHECK(strstr(err_text, "no shared secret") == NULL);
    char path[1300], out[1 << 16];
    snprintf(path, sizeof path, "%s/srun.out", d);
    test_slurp(path, out, sizeof out);
    CHECK_STR_CONTAINS(out, "dtrain: launched by Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID): rank 0 of 2, local "
                            "rank 0 of 2; rendezvous at 127.0.0.1:");
    test_same_weights("fork", "srun");

    /* the shipped batch script, as a user submits it */
    snprintf(cmd, sizeof cmd,
             "cd '%s' && DTRAIN='%s' sbatch --wait --ntasks=2 --output='%s/sbatch.out' scripts/slurm/dtrain.sbatch "
             "configs/ci-smoke.yaml --set 'run.dir=%s/sbatch' --set data.batch_size_per_worker=4 --set "
             "training.cpu_threads_per_worker=1 --progress never",
             DTRAIN_SOURCE_DIR, DTRAIN_BIN, d, d);
    run_cmd(cmd);
    snprintf(path, sizeof path, "%s/sbatch.out", d);
    test_slurp(path, out, sizeof out);
    CHECK_STR_CONTAINS(out, "launched by Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID): rank 0 of 2");
    CHECK(strstr(out, "no shared secret") == NULL); /* the script made one for the job, and every task has it */
    test_same_weights("fork", "sbatch");

    stop_daemons();
    pidfiles[0][0] = pidfiles[1][0] = pidfiles[2][0] = '\0';
    test_dir_remove();
    TEST_PASS("test_slurm");
}
