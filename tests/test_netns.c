/* test_netns.c — two "hosts" on one machine: two Linux network namespaces joined by a veth
 * pair, one dtrain process in each, talking over that link:
 *   - started by mpirun (the remote one through a small agent that enters the other
 *     namespace instead of ssh): the mpi collective;
 *   - started by hand with RANK/WORLD_SIZE/MASTER_ADDR, each in its own UTS namespace too
 *     (another host name), as a Kubernetes Indexed Job would, with a shared secret: the tcp
 *     ring; every listener of the ranks is bound to its namespace's address, none to 0.0.0.0;
 *     and the same with communication_backend: shm, which is refused (exit 2) instead;
 *   - two ranks in each namespace (host names dtrain-host-A and -B): the hierarchical collective
 *     (training.hierarchical_allreduce: auto) against the flat ring (off): both match the fork
 *     run, and fewer bytes cross between the hosts (the summary's remote_bytes_per_step).
 * Each result must match the fork-mode run with the same global batch (relative L2
 * distance of the weights <= 1e-5).
 *
 * Needs root (ip netns), iproute2 and Open MPI; exits 77 (skipped) naming what is missing
 * when the machine cannot make namespaces, and fails when dtrain has no mpi collective. */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "proc.h"
#include "testutil.h"
#include "weights.h"

static char ns_a[32], ns_b[32], veth_a[16], veth_b[16];
static int made;

static int sh(const char *fmt, const char *a, const char *b, const char *c) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, fmt, a, b, c);
    int rc = system(cmd);
    if (rc != 0) printf("command failed (%d): %s\n", rc, cmd);
    return rc;
}

static void cleanup(void) {
    if (!made) return;
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null", ns_a, ns_b);
    if (system(cmd) != 0) printf("cleanup: %s failed\n", cmd);
}

/* Rank r of `world` as a Kubernetes Indexed Job or torchrun starts it, in namespace `ns` with a
 * UTS namespace of its own (host name "dtrain-host-HOST"), local rank `lr` of `lw`, told where
 * rank 0 is (master, port) and the shared secret; logs TAG-rR.out/.err. */
static pid_t start_rank(const char *tag, int r, int world, const char *ns, const char *host, int lr, int lw,
                        const char *master, const char *port, const char *run_dir, const char *sets) {
    char script[2048], name[32];
    snprintf(name, sizeof name, "%s-r%d", tag, r);
    snprintf(script, sizeof script,
             "hostname dtrain-host-%s && exec env RANK=%d WORLD_SIZE=%d LOCAL_RANK=%d LOCAL_WORLD_SIZE=%d "
             "DTRAIN_RDZV_SECRET=netns-test-secret-0123456789 %s %s '%s' --config configs/ci-smoke.yaml --set '%s' %s "
             "--set training.collective_timeout_s=60 --progress never",
             host, r, world, lr, lw, master, port, DTRAIN_BIN, run_dir, sets);
    const char *args[] = {"netns", "exec", ns, "unshare", "--uts", "sh", "-c", script, NULL};
    return spawn_prog(name, "/usr/sbin/ip", args);
}

/* One rank per host: rank 0 in A, the others in B, each its own host name "dtrain-host-R". */
static pid_t start_host(const char *tag, int r, int world, const char *master, const char *port, const char *run_dir,
                        const char *sets) {
    char host[16];
    snprintf(host, sizeof host, "%d", r);
    return start_rank(tag, r, world, r ? ns_b : ns_a, host, 0, 1, master, port, run_dir, sets);
}

/* Rank r of 4, two on each "host": ranks 0-1 in namespace A (host name dtrain-host-A), 2-3 in B,
 * LOCAL_RANK r % 2 of 2. */
static pid_t start_pair_rank(const char *tag, int r, const char *master, const char *port, const char *run_dir,
                             const char *sets) {
    return start_rank(tag, r, 4, r < 2 ? ns_a : ns_b, r < 2 ? "A" : "B", r % 2, 2, master, port, run_dir, sets);
}

/* the summary's number `key` in RUN/metrics.jsonl (NaN: none) */
static double summary_value(const char *run, const char *key) {
    char path[1300], text[1 << 16];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", test_dir(), run);
    test_slurp(path, text, sizeof text);
    const char *sum = strstr(text, "\"type\":\"summary\"");
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = sum ? strstr(sum, k) : NULL;
    return p ? strtod(p + strlen(k), NULL) : NAN;
}

/* ranks 1 and 0 of 2 */
static void start_hosts(const char *tag, const char *master, const char *port, const char *run_dir, const char *sets,
                        pid_t pids[2]) {
    for (int r = 1; r >= 0; r--) pids[r] = start_host(tag, r, 2, master, port, run_dir, sets);
}

/* The TCP listeners in the network namespace of process `pid` (/proc/PID/net/tcp, tcp6): how
 * many, and how many of them on the wildcard address; `port` (> 0): whether one listens there. */
static int listeners(pid_t pid, int port, int *wildcard, int *on_port) {
    int n = 0;
    *wildcard = *on_port = 0;
    const char *files[] = {"tcp", "tcp6"};
    for (int f = 0; f < 2; f++) {
        char path[64], line[512], addr[64];
        snprintf(path, sizeof path, "/proc/%ld/net/%s", (long)pid, files[f]);
        FILE *fp = fopen(path, "r");
        if (!fp) continue;
        while (fgets(line, sizeof line, fp)) {
            unsigned lport, st;
            if (sscanf(line, " %*d: %63[0-9A-Fa-f]:%x %*[0-9A-Fa-f]:%*x %x", addr, &lport, &st) != 3 || st != 0x0A)
                continue;
            n++;
            *wildcard += strspn(addr, "0") == strlen(addr);
            *on_port |= (int)lport == port;
        }
        fclose(fp);
    }
    return n;
}

int main(void) {
    test_dir_init("netns");
    if (getuid() != 0) {
        printf("test_netns: skipped: needs root for ip netns\n");
        return 77;
    }
    if (access("/usr/bin/mpirun", X_OK) != 0) {
        printf("test_netns: /usr/bin/mpirun is missing (scripts/test.sh installs openmpi-bin)\n");
        return 1;
    }
#ifndef DTRAIN_TEST_HAVE_MPI
    printf("test_netns: dtrain was built without the mpi collective (libopenmpi-dev; scripts/test.sh installs it)\n");
    return 1;
#endif
    long id = (long)getpid() % 200 + 20;
    char net[160], ip_a[32], ip_b[32];
    snprintf(ns_a, sizeof ns_a, "dtrainA%ld", id);
    snprintf(ns_b, sizeof ns_b, "dtrainB%ld", id);
    snprintf(veth_a, sizeof veth_a, "dtva%ld", id);
    snprintf(veth_b, sizeof veth_b, "dtvb%ld", id);
    snprintf(net, sizeof net, "10.231.%ld.0/24", id);
    snprintf(ip_a, sizeof ip_a, "10.231.%ld.1", id);
    snprintf(ip_b, sizeof ip_b, "10.231.%ld.2", id);
    snprintf(net, sizeof net, "ip netns del %s 2>/dev/null; ip netns del %s 2>/dev/null; true", ns_a, ns_b);
    if (system(net) != 0) printf("(could not clear old namespaces)\n"); /* left by a killed run with our pid */
    snprintf(net, sizeof net, "10.231.%ld.0/24", id);
    if (sh("ip netns add %s%s%s", ns_a, "", "") != 0) {
        printf("test_netns: skipped: this machine cannot create network namespaces\n");
        return 77;
    }
    made = 1;
    atexit(cleanup);
    CHECK(sh("ip netns add %s%s%s", ns_b, "", "") == 0);
    CHECK(sh("ip link add %s type veth peer name %s%s", veth_a, veth_b, "") == 0);
    CHECK(sh("ip link set %s netns %s%s", veth_a, ns_a, "") == 0);
    CHECK(sh("ip link set %s netns %s%s", veth_b, ns_b, "") == 0);
    char addr[64];
    snprintf(addr, sizeof addr, "%s/24", ip_a);
    CHECK(sh("ip -n %s addr add %s dev %s", ns_a, addr, veth_a) == 0);
    snprintf(addr, sizeof addr, "%s/24", ip_b);
    CHECK(sh("ip -n %s addr add %s dev %s", ns_b, addr, veth_b) == 0);
    CHECK(sh("ip -n %s link set %s up && ip -n %s link set lo up", ns_a, veth_a, ns_a) == 0);
    CHECK(sh("ip -n %s link set %s up && ip -n %s link set lo up", ns_b, veth_b, ns_b) == 0);

    /* mpirun's remote-start agent: "ssh HOST CMD" becomes "enter HOST's namespace, run CMD" */
    char agent[1300], script[1024];
    snprintf(agent, sizeof agent, "%s/nsexec", test_dir());
    int n = snprintf(script, sizeof script,
                     "#!/bin/sh\nhost=$1; shift\ncase \"$host\" in\n  %s) ns=%s ;;\n  %s) ns=%s ;;\n"
                     "  *) echo \"nsexec: unknown host $host\" >&2; exit 1 ;;\nesac\nexec ip netns exec \"$ns\" sh -c \"$*\"\n",
                     ip_a, ns_a, ip_b, ns_b);
    test_write_file(agent, script, (size_t)n);
    CHECK(chmod(agent, 0755) == 0);

    /* the reference: dtrain forks 2 workers on one host */
    char rd[1400];
    snprintf(rd, sizeof rd, "run.dir=%s/fork", test_dir());
    const char *fargs[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", "training.num_workers=2", "--set",
                           "data.batch_size_per_worker=4", "--set", "training.cpu_threads_per_worker=1", "--progress",
                           "never", NULL};
    CHECK_INT_EQ(wait_exit(spawn("fork", fargs), "fork"), 0);

    /* two hosts: mpirun in namespace A starts rank 0 there and rank 1 in B */
    char hosts[128], rd2[1400];
    snprintf(hosts, sizeof hosts, "%s:1,%s:1", ip_a, ip_b);
    snprintf(rd2, sizeof rd2, "run.dir=%s/hosts", test_dir());
    const char *margs[] = {"netns", "exec", ns_a, "/usr/bin/mpirun", "--allow-run-as-root", "-np", "2", "--host", hosts,
                           "--mca", "plm_rsh_agent", agent, "--mca", "btl", "tcp,self", "--mca", "oob_tcp_if_include", net,
                           "--mca", "btl_tcp_if_include", net, DTRAIN_BIN, "--config", "configs/ci-smoke.yaml", "--set",
                           rd2, "--set", "training.num_workers=2", "--set", "data.batch_size_per_worker=4", "--set",
                           "training.cpu_threads_per_worker=1", "--set", "training.collective_timeout_s=60", "--progress",
                           "never", NULL};
    CHECK_INT_EQ(wait_exit(spawn_prog("hosts", "/usr/sbin/ip", margs), "hosts"), 0);
    char path[1300], out[1 << 16];
    snprintf(path, sizeof path, "%s/hosts.out", test_dir());
    test_slurp(path, out, sizeof out);
    /* one rank per namespace: each host has a local world of 1, so the mpi collective is picked */
    CHECK_STR_CONTAINS(out, "rank 0 of 2, local rank 0 of 1; the mpi collective");
    CHECK_STR_CONTAINS(out, "mpi all-reduce");
    snprintf(path, sizeof path, "%s/hosts/rank-1.log", test_dir());
    test_slurp(path, out, sizeof out);
    CHECK_STR_CONTAINS(out, "rank 1 of 2, local rank 0 of 1; the mpi collective");

    CHECK(run_distance("hosts", "fork") <= 1e-5);

    /* the same two hosts without mpirun, as a Kubernetes Indexed Job or torchrun starts them:
     * each rank in its own network and UTS namespace (its own host name), rank 1 told where
     * rank 0 is; the rendezvous sees two hosts and builds the tcp ring over the veth link */
    char port[32], master[64], rd3[1400];
    snprintf(port, sizeof port, "MASTER_PORT=%d", 29000 + (int)id);
    snprintf(master, sizeof master, "MASTER_ADDR=%s", ip_a);
    snprintf(rd3, sizeof rd3, "run.dir=%s/tcp", test_dir());
    pid_t pids[2];
    start_hosts("tcp", master, port, rd3, "--set training.num_workers=2 --set data.batch_size_per_worker=4 --set "
                "training.cpu_threads_per_worker=1", pids);
    CHECK_INT_EQ(wait_exit(pids[0], "tcp-r0"), 0);
    CHECK_INT_EQ(wait_exit(pids[1], "tcp-r1"), 0);
    snprintf(path, sizeof path, "%s/tcp-r0.out", test_dir());
    test_slurp(path, out, sizeof out);
    char want[128];
    snprintf(want, sizeof want, "rank 0 of 2, local rank 0 of 1; rendezvous at %s:", ip_a);
    CHECK_STR_CONTAINS(out, want);
    CHECK_STR_CONTAINS(out, "tcp all-reduce");
    CHECK(run_distance("tcp", "fork") <= 1e-5);

    /* the ranks listen at the addresses they use, not on every address of their host: while
     * rank 0 (in A) and rank 1 (in B) wait for a rank 2 that never comes, every listener in
     * either namespace (rank 0's rendezvous port and ring listener, rank 1's ring listener) is
     * bound to that namespace's veth address */
    snprintf(rd3, sizeof rd3, "run.dir=%s/bind", test_dir());
    pids[0] = start_host("bind", 0, 3, master, port, rd3, "--set training.num_workers=3");
    pids[1] = start_host("bind", 1, 3, master, port, rd3, "--set training.num_workers=3");
    int wild0 = 0, wild1 = 0, on_port = 0, n0 = 0, n1 = 0, rport = 29000 + (int)id;
    for (int i = 0; i < 300 && !(on_port && n0 >= 2 && n1 >= 1); i++) {
        sleep_ms(50);
        n0 = listeners(pids[0], rport, &wild0, &on_port);
        int dummy;
        n1 = listeners(pids[1], 0, &wild1, &dummy);
    }
    printf("bind: namespace A: %d listeners (%d on the wildcard address, rendezvous port %s), B: %d (%d)\n", n0, wild0,
           on_port ? "up" : "down", n1, wild1);
    kill(pids[0], SIGTERM);
    kill(pids[1], SIGTERM);
    wait_exit(pids[0], "bind-r0");
    wait_exit(pids[1], "bind-r1");
    CHECK(on_port && n0 >= 2 && n1 >= 1);
    CHECK_INT_EQ(wild0, 0);
    CHECK_INT_EQ(wild1, 0);

    /* the same two hosts with training.communication_backend: shm, which cannot span hosts:
     * rank 0 refuses it at the rendezvous, naming the file and the key, and every rank exits 2
     * (it used to become the tcp ring without a word) */
    snprintf(rd3, sizeof rd3, "run.dir=%s/shm", test_dir());
    start_hosts("shm", master, port, rd3, "--set training.communication_backend=shm", pids);
    CHECK_INT_EQ(wait_exit(pids[0], "shm-r0"), 2);
    CHECK_STR_CONTAINS(err_text, "configs/ci-smoke.yaml: training.communication_backend: shm needs every rank on one "
                                 "host, but the ranks are on several");
    CHECK_INT_EQ(wait_exit(pids[1], "shm-r1"), 2);
    CHECK_STR_CONTAINS(err_text, "rank 0 refused rank 1: configs/ci-smoke.yaml: training.communication_backend: shm");

    /* two ranks on each host: the hierarchical collective (auto) and the flat ring (off), both
     * against dtrain forking 4 workers with the same global batch */
    snprintf(rd, sizeof rd, "run.dir=%s/fork4", test_dir());
    const char *f4[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", "training.num_workers=4", "--set",
                        "data.batch_size_per_worker=2", "--set", "training.cpu_threads_per_worker=1", "--progress",
                        "never", NULL};
    CHECK_INT_EQ(wait_exit(spawn("fork4", f4), "fork4"), 0);
    const char *modes[2] = {"off", "auto"};
    double between[2];
    for (int m = 0; m < 2; m++) {
        char tag[32], sets[256];
        snprintf(tag, sizeof tag, "pairs-%s", modes[m]);
        snprintf(rd3, sizeof rd3, "run.dir=%s/%s", test_dir(), tag);
        snprintf(sets, sizeof sets, "--set training.num_workers=4 --set data.batch_size_per_worker=2 --set "
                 "training.cpu_threads_per_worker=1 --set training.hierarchical_allreduce=%s", modes[m]);
        snprintf(port, sizeof port, "MASTER_PORT=%d", 29300 + (int)id + m);
        pid_t p4[4];
        for (int r = 3; r >= 0; r--) p4[r] = start_pair_rank(tag, r, master, port, rd3, sets);
        for (int r = 0; r < 4; r++) {
            char who[40];
            snprintf(who, sizeof who, "%s-r%d", tag, r);
            CHECK_INT_EQ(wait_exit(p4[r], who), 0);
        }
        snprintf(path, sizeof path, "%s/%s-r0.out", test_dir(), tag);
        test_slurp(path, out, sizeof out);
        if (m == 1) {
            CHECK_STR_CONTAINS(out, "gradients hierarchical: 2 hosts x 2 ranks, shared memory inside each host, a tcp "
                                    "ring of the 2 hosts' first ranks between them (training.hierarchical_allreduce: auto)");
            CHECK_STR_CONTAINS(out, "4 workers x 1 threads, tcp+shm all-reduce");
            CHECK_STR_CONTAINS(out, " MB per step between hosts)");
        } else {
            CHECK_STR_CONTAINS(out, "4 workers x 1 threads, tcp all-reduce");
        }
        between[m] = summary_value(tag, "remote_bytes_per_step");
        printf("%s vs fork4: weights rel L2 distance %.2e; %.0f bytes per step between the hosts\n", tag,
               run_distance(tag, "fork4"), between[m]);
        CHECK(run_distance(tag, "fork4") <= 1e-5);
    }
    /* flat: 2 of the 4 ring links cross, each carrying 2(4-1)/4 = 1.5 x the gradients; hierarchical:
     * the 2 leaders' ring, 2(2-1)/2 = 1 x each: 2/3 of the bytes (the agreement aside) */
    CHECK(between[1] > 0 && between[1] < 0.7 * between[0]);
    test_dir_remove();
    TEST_PASS("test_netns");
}
