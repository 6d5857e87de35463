/* test_rdzv_auth.c — the TCP rendezvous against strangers, with the real dtrain binary and
 * hand-made clients and servers on 127.0.0.1:
 *   - with a shared secret (rank 0 reads it from DTRAIN_RDZV_SECRET_FILE, rank 1 from
 *     DTRAIN_RDZV_SECRET): a forged hello with a wrong config digest and no MAC, one with a
 *     wrong MAC, a line of terminal escapes and a dtrain rank with another secret are dropped:
 *     the job does not end, they learn neither rank 0's digest nor the shared-memory name,
 *     rank 0 logs them with the escapes replaced, and the job trains once the real rank 1 comes;
 *   - five idle connections opened before the real rank do not keep it out past the deadline;
 *   - a rank with the secret but another config is still refused (exit 2), naming both digests;
 *   - the ring of the tcp collective: idle connections and a forged ring hello at a rank's ring
 *     listener do not take the place of its neighbour;
 *   - a secret on one side only fails that rank with a message (exit 2), not a hang;
 *   - a secret file readable by others, a short secret, or a variable set but empty (a failed
 *     $VAR expansion), is refused (exit 2, naming it);
 *   - an ERR line full of escapes from a fake rank 0 is printed with them replaced;
 *   - without a secret: one warning naming the variables, and the job works;
 *   - the secret appears in no output, nor in the environment of a running rank;
 *   - a flood of idle connections from twelve other loopback addresses at rank 0's rendezvous
 *     port and at the ring listeners does not push out the real ranks (from 127.0.0.1): the
 *     job starts and trains;
 *   - MASTER_ADDR naming this host, which resolves to a loopback address here, with no local
 *     world size (hand-set RANK/WORLD_SIZE): rank 0 listens on every address, with a note. */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "proc.h"
#include "testutil.h"

#define SECRET "c2f1e0d9b8a7-test-secret-0123456789"

static char out_text[1 << 18];

/* rank `rank` of `world` at 127.0.0.1:port, run dir RUN, extra "NAME=value" variables (NULL-ended)
 * and one more --set (or NULL) */
static pid_t start_rank(const char *tag, int rank, int world, int port, const char *run, const char *const *vars,
                        const char *extra_set, const char *timeout) {
    static char sets[8][1400];
    static int next;
    char *rd = sets[next++ % 8], *nw = sets[next++ % 8], *to = sets[next++ % 8];
    snprintf(rd, 1400, "run.dir=%s/%s", test_dir(), run);
    snprintf(nw, 1400, "training.num_workers=%d", world);
    snprintf(to, 1400, "training.collective_timeout_s=%s", timeout);
    proc_clear_launcher_env();
    char v[64];
    snprintf(v, sizeof v, "%d", rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof v, "%d", world);
    setenv("WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    snprintf(v, sizeof v, "%d", port);
    setenv("MASTER_PORT", v, 1);
    for (int i = 0; vars && vars[i]; i++) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", vars[i]);
        char *eq = strchr(buf, '=');
        CHECK(eq != NULL);
        *eq = '\0';
        setenv(buf, eq + 1, 1);
    }
    const char *args[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", nw, "--set",
                          "data.batch_size_per_worker=4", "--set", to, "--set", "training.cpu_threads_per_worker=1",
                          "--progress", "never", extra_set ? "--set" : NULL, extra_set, NULL};
    pid_t p = spawn(tag, args);
    proc_clear_launcher_env();
    return p;
}

/* a connection to 127.0.0.1:port, retried for up to 20 s while nobody listens yet */
static int connect_retry(int port) {
    for (int i = 0; i < 400; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        CHECK(fd >= 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                 .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) return fd;
        close(fd);
        sleep_ms(50);
    }
    printf("nobody listens on port %d\n", port);
    CHECK(0);
    return -1;
}

/* whatever arrives on fd within ms milliseconds of silence, until the peer closes */
static size_t read_some(int fd, char *buf, size_t n, int ms) {
    size_t k = 0;
    for (;;) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, ms) <= 0) break;
        ssize_t got = recv(fd, buf + k, n - 1 - k, 0);
        if (got <= 0) break;
        k += (size_t)got;
        if (k + 1 >= n) break;
    }
    buf[k] = '\0';
    return k;
}

static void send_text(int fd, const char *s) { CHECK(send(fd, s, strlen(s), MSG_NOSIGNAL) == (ssize_t)strlen(s)); }

/* the text an impostor gets holds nothing a rank of the job would need */
static void check_learns_nothing(const char *got) {
    printf("an impostor received: \"%s\"\n", got);
    CHECK(strstr(got, "digest") == NULL);
    CHECK(strstr(got, "shm") == NULL);
    CHECK(strstr(got, "OK") == NULL);
    CHECK(strstr(got, "tcp") == NULL);
}

static void check_no_escape_and_no_secret(const char *tag) {
    char path[1300];
    const char *ext[] = {"out", "err"};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s.%s", test_dir(), tag, ext[i]);
        test_slurp(path, out_text, sizeof out_text);
        CHECK(strchr(out_text, '\x1b') == NULL);
        CHECK(strchr(out_text, '\a') == NULL);
        CHECK(strstr(out_text, SECRET) == NULL);
    }
}

static const char *secret_file(const char *name, mode_t mode, const char *content) {
    const char *path = test_path(name);
    test_write_file(path, content, strlen(content));
    CHECK(chmod(path, mode) == 0);
    return path;
}

/* strangers at rank 0 while it waits for rank 1 */
static void test_impostors(void) {
    int port = proc_free_port();
    char file_var[1400];
    snprintf(file_var, sizeof file_var, "DTRAIN_RDZV_SECRET_FILE=%s", secret_file("secret", 0600, SECRET "\n"));
    const char *v0[] = {file_var, NULL}, *v1[] = {"DTRAIN_RDZV_SECRET=" SECRET, NULL};
    const char *wrong[] = {"DTRAIN_RDZV_SECRET=another-secret-of-the-same-length", NULL};
    pid_t p0 = start_rank("imp-r0", 0, 2, port, "imp", v0, NULL, "30");
    char got[4096];
    /* a forged hello in today's and yesterday's form with a digest that is not rank 0's */
    int fd = connect_retry(port);
    read_some(fd, got, sizeof got, 300);
    send_text(fd, "DTRAIN-RDZV 1 rank=1 world=2 digest=00000000 host=evil data=1\n");
    read_some(fd, got, sizeof got, 2000);
    check_learns_nothing(got);
    close(fd);
    fd = connect_retry(port);
    read_some(fd, got, sizeof got, 300);
    send_text(fd, "DTRAIN-RDZV 2 rank=1 world=2 digest=00000000 host=evil data=1 "
                  "nonce=00000000000000000000000000000000 "
                  "mac=0000000000000000000000000000000000000000000000000000000000000000\n");
    read_some(fd, got, sizeof got, 2000);
    check_learns_nothing(got);
    close(fd);
    fd = connect_retry(port);
    send_text(fd, "\x1b]0;pwned\x07\x1b[2J hello\n");
    read_some(fd, got, sizeof got, 2000);
    check_learns_nothing(got);
    close(fd);
    /* a dtrain rank with another secret is turned away and says why */
    pid_t pw = start_rank("imp-wrong", 1, 2, port, "imp-wrong", wrong, NULL, "5");
    CHECK_INT_EQ(wait_exit(pw, "imp-wrong"), 2);
    CHECK_STR_CONTAINS(err_text, "rank 0 refused rank 1: authentication failed");
    CHECK_STR_CONTAINS(err_text, "DTRAIN_RDZV_SECRET");
    /* the real rank 1: the job starts and trains */
    pid_t p1 = start_rank("imp-r1", 1, 2, port, "imp", v1, NULL, "30");
    CHECK_INT_EQ(wait_exit(p1, "imp-r1"), 0);
    CHECK_INT_EQ(wait_exit(p0, "imp-r0"), 0);
    CHECK_STR_CONTAINS(err_text, "rendezvous: dropped a connection from 127.0.0.1:");
    CHECK(strstr(err_text, "warning: the rendezvous") == NULL); /* a secret: no warning */
    char path[1300];
    snprintf(path, sizeof path, "%s/imp-r0.out", test_dir());
    test_slurp(path, out_text, sizeof out_text);
    CHECK_STR_CONTAINS(out_text, "done: 20 steps");
    check_no_escape_and_no_secret("imp-r0");
    check_no_escape_and_no_secret("imp-r1");
    check_no_escape_and_no_secret("imp-wrong");
}

/* five connections that never say a word, opened before the real rank 1 */
static void test_idle(void) {
    int port = proc_free_port();
    const char *v[] = {"DTRAIN_RDZV_SECRET=" SECRET, NULL};
    pid_t p0 = start_rank("idle-r0", 0, 2, port, "idle", v, NULL, "15");
    int idle[5];
    for (int i = 0; i < 5; i++) idle[i] = connect_retry(port);
    sleep_ms(300);
    pid_t p1 = start_rank("idle-r1", 1, 2, port, "idle", v, NULL, "15");
    CHECK_INT_EQ(wait_exit(p1, "idle-r1"), 0);
    CHECK_INT_EQ(wait_exit(p0, "idle-r0"), 0);
    for (int i = 0; i < 5; i++) close(idle[i]);
}

/* a genuine rank (it has the secret) with another config: the mistake is still named */
static void test_other_config(void) {
    int port = proc_free_port();
    const char *v[] = {"DTRAIN_RDZV_SECRET=" SECRET, NULL};
    pid_t p0 = start_rank("cfg-r0", 0, 2, port, "cfg", v, NULL, "20");
    pid_t p1 = start_rank("cfg-r1", 1, 2, port, "cfg", v, "optimizer.lr=0.002", "20");
    CHECK_INT_EQ(wait_exit(p0, "cfg-r0"), 2);
    CHECK_STR_CONTAINS(err_text, "rank 1 runs another config than rank 0 (config digest ");
    CHECK_STR_CONTAINS(err_text, ", rank 0 has ");
    CHECK_INT_EQ(wait_exit(p1, "cfg-r1"), 2);
    CHECK_STR_CONTAINS(err_text, "rank 0 refused rank 1: rank 1 runs another config than rank 0");
}

/* the TCP ports `pid` listens on (its sockets in /proc/PID/fd matched with /proc/net/tcp) */
static int listening_ports(pid_t pid, int *ports, int max) {
    char path[64], link[128];
    long inodes[256];
    int ni = 0, n = 0;
    snprintf(path, sizeof path, "/proc/%ld/fd", (long)pid);
    DIR *d = opendir(path);
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && ni < 256) {
        char fdp[400];
        snprintf(fdp, sizeof fdp, "%s/%s", path, e->d_name);
        ssize_t k = readlink(fdp, link, sizeof link - 1);
        if (k <= 0) continue;
        link[k] = '\0';
        long ino;
        if (sscanf(link, "socket:[%ld]", &ino) == 1) inodes[ni++] = ino;
    }
    closedir(d);
    FILE *f = fopen("/proc/net/tcp", "r");
    CHECK(f != NULL);
    char line[512];
    while (fgets(line, sizeof line, f) && n < max) {
        unsigned addr, lport, st;
        long ino;
        if (sscanf(line, " %*d: %x:%x %*x:%*x %x %*x:%*x %*x:%*x %*x %*d %*d %ld", &addr, &lport, &st, &ino) != 4) continue;
        for (int i = 0; i < ni; i++)
            if (st == 0x0A && inodes[i] == ino) ports[n++] = (int)lport;
    }
    fclose(f);
    return n;
}

/* the tcp collective's ring: rank 1's ring listener gets idle connections and a forged ring
 * hello claiming to be rank 0 before the ring is made */
static void test_ring(void) {
    int port = proc_free_port();
    const char *v[] = {"DTRAIN_RDZV_SECRET=" SECRET, NULL};
    const char *tcp = "training.communication_backend=tcp";
    pid_t p0 = start_rank("ring-r0", 0, 3, port, "ring", v, tcp, "30");
    pid_t p1 = start_rank("ring-r1", 1, 3, port, "ring", v, tcp, "30");
    int ports[8], n = 0;
    for (int i = 0; i < 200 && n == 0; i++) {
        sleep_ms(50);
        n = listening_ports(p1, ports, 8);
    }
    CHECK(n >= 1); /* rank 1's ring listener */
    int fds[8][6];
    char got[4096];
    for (int j = 0; j < n; j++) {
        for (int i = 0; i < 5; i++) fds[j][i] = connect_retry(ports[j]);
        fds[j][5] = connect_retry(ports[j]);
        send_text(fds[j][5], "DTRAIN-RING rank=0\n");
        send_text(fds[j][5], "DTRAIN-RING 2 rank=0 nonce=00000000000000000000000000000000 "
                             "mac=0000000000000000000000000000000000000000000000000000000000000000\n");
    }
    pid_t p2 = start_rank("ring-r2", 2, 3, port, "ring", v, tcp, "30");
    CHECK_INT_EQ(wait_exit(p2, "ring-r2"), 0);
    CHECK_INT_EQ(wait_exit(p1, "ring-r1"), 0);
    CHECK_INT_EQ(wait_exit(p0, "ring-r0"), 0);
    char path[1300];
    snprintf(path, sizeof path, "%s/ring-r0.out", test_dir());
    test_slurp(path, out_text, sizeof out_text);
    CHECK_STR_CONTAINS(out_text, "tcp all-reduce");
    for (int j = 0; j < n; j++) {
        read_some(fds[j][5], got, sizeof got, 100);
        check_learns_nothing(got);
        for (int i = 0; i < 6; i++) close(fds[j][i]);
    }
}

/* a secret on one side only: the rank that cannot meet the other says so and exits 2 */
static void test_one_sided(void) {
    int port = proc_free_port();
    const char *v[] = {"DTRAIN_RDZV_SECRET=" SECRET, NULL};
    pid_t p0 = start_rank("one0-r0", 0, 2, port, "one0", v, NULL, "4");
    pid_t p1 = start_rank("one0-r1", 1, 2, port, "one0", NULL, NULL, "4");
    CHECK_INT_EQ(wait_exit(p1, "one0-r1"), 2);
    CHECK_STR_CONTAINS(err_text, "requires the shared secret");
    CHECK_STR_CONTAINS(err_text, "DTRAIN_RDZV_SECRET");
    CHECK_INT_EQ(wait_exit(p0, "one0-r0"), 1);
    CHECK_STR_CONTAINS(err_text, "rank(s) 1 did not arrive");
    port = proc_free_port();
    p0 = start_rank("one1-r0", 0, 2, port, "one1", NULL, NULL, "4");
    p1 = start_rank("one1-r1", 1, 2, port, "one1", v, NULL, "4");
    CHECK_INT_EQ(wait_exit(p1, "one1-r1"), 2);
    CHECK_STR_CONTAINS(err_text, "runs without a shared secret");
    CHECK_INT_EQ(wait_exit(p0, "one1-r0"), 1);
    CHECK_STR_CONTAINS(err_text, "a rank with a shared secret?"); /* rank 0 hints at the secret */
}

/* 1 when the environment block of `pid` holds `text` */
static int environ_holds(pid_t pid, const char *text) {
    char path[64], buf[1 << 16];
    snprintf(path, sizeof path, "/proc/%ld/environ", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\0') buf[i] = '\n';
    buf[n] = '\0';
    return strstr(buf, text) != NULL;
}

/* A child that opens connections to the ports, round robin from 127.0.0.2..127.0.0.13, as fast
 * as it can, holding the newest 400 (silent), until killed. */
static pid_t flood(const int *ports, int nports) {
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid > 0) return pid;
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlives the test */
    static int held[400];
    int k = 0, n = 0;
    for (unsigned long i = 0;; i++) {
        if (n == 400) {
            struct linger lg = {1, 0}; /* a reset: no TIME_WAIT for the flood */
            setsockopt(held[k], SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
            close(held[k]);
            n--;
        }
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
        if (fd < 0) _exit(1);
        int one = 1;
        setsockopt(fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
        struct sockaddr_in src = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(0x7f000002u + (uint32_t)(i % 12))};
        struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons((uint16_t)ports[i / 12 % (unsigned)nports]),
                                  .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (bind(fd, (struct sockaddr *)&src, sizeof src) != 0 ||
            (connect(fd, (struct sockaddr *)&dst, sizeof dst) != 0 && errno != EINPROGRESS)) {
            close(fd);
            sleep_ms(1);
            continue;
        }
        held[(k + n) % 400] = fd;
        if (n == 399) k = (k + 1) % 400;
        n++;
    }
}

static void stop(pid_t pid) {
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* a flood of silent connections at rank 0's port and at the ring listeners while the ranks meet */
static void test_flood(void) {
    int port = proc_free_port();
    const char *v[] = {"DTRAIN_RDZV_SECRET=" SECRET, NULL};
    const char *tcp = "training.communication_backend=tcp";
    pid_t f0 = flood(&port, 1);
    pid_t p0 = start_rank("flood-r0", 0, 3, port, "flood", v, tcp, "40");
    pid_t p1 = start_rank("flood-r1", 1, 3, port, "flood", v, tcp, "40");
    int ports[16], n = 0;
    for (int i = 0; i < 400 && n < 3; i++) { /* rank 0's two listeners, rank 1's ring listener */
        sleep_ms(50);
        n = listening_ports(p0, ports, 8);
        n += listening_ports(p1, ports + n, 8);
    }
    CHECK(n >= 3);
    int leaked = environ_holds(p0, SECRET) + environ_holds(p1, SECRET);
    pid_t f1 = flood(ports, n);
    sleep_ms(300);
    pid_t p2 = start_rank("flood-r2", 2, 3, port, "flood", v, tcp, "40");
    int r2 = wait_exit(p2, "flood-r2"), r1 = wait_exit(p1, "flood-r1"), r0 = wait_exit(p0, "flood-r0");
    stop(f0);
    stop(f1);
    CHECK_INT_EQ(r2, 0);
    CHECK_INT_EQ(r1, 0);
    CHECK_INT_EQ(r0, 0);
    CHECK_INT_EQ(leaked, 0); /* the secret is gone from the ranks' environment */
    char path[1300];
    snprintf(path, sizeof path, "%s/flood-r0.out", test_dir());
    test_slurp(path, out_text, sizeof out_text);
    CHECK_STR_CONTAINS(out_text, "done: 20 steps");
}

/* MASTER_ADDR: this host's name, which resolves to loopback here (/etc/hosts), and no local
 * world size: rank 0 cannot tell that every rank is here, so it listens on every address */
static void test_name_is_loopback(void) {
    char host[256], addr[64];
    CHECK(gethostname(host, sizeof host) == 0);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res) {
        printf("skipped: %s does not resolve here\n", host);
        return;
    }
    inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, addr, sizeof addr);
    freeaddrinfo(res);
    if (strncmp(addr, "127.", 4) != 0) {
        printf("skipped: %s is %s here, not a loopback address\n", host, addr);
        return;
    }
    int port = proc_free_port();
    char ma[300];
    snprintf(ma, sizeof ma, "MASTER_ADDR=%s", host);
    const char *v[] = {"DTRAIN_RDZV_SECRET=" SECRET, ma, NULL};
    pid_t p0 = start_rank("lo-r0", 0, 2, port, "lo", v, NULL, "20");
    int any = 0;
    for (int i = 0; i < 200 && !any; i++) {
        sleep_ms(50);
        FILE *f = fopen("/proc/net/tcp", "r");
        CHECK(f != NULL);
        char line[512];
        while (fgets(line, sizeof line, f)) {
            unsigned a, lp, st;
            if (sscanf(line, " %*d: %x:%x %*x:%*x %x", &a, &lp, &st) == 3 && st == 0x0A && (int)lp == port) any = a == 0;
        }
        fclose(f);
    }
    pid_t p1 = start_rank("lo-r1", 1, 2, port, "lo", v, NULL, "20");
    CHECK_INT_EQ(wait_exit(p1, "lo-r1"), 0);
    CHECK_INT_EQ(wait_exit(p0, "lo-r0"), 0);
    CHECK(any); /* 0.0.0.0:port, not 127.x:port */
    CHECK_STR_CONTAINS(err_text, "listening on every address of this host, not at MASTER_ADDR=");
    CHECK_STR_CONTAINS(err_text, "loopback address here");
}

/* secrets that are refused before anything listens */
static void test_bad_secrets(void) {
    char file_var[1400], both[1400];
    const char *path = secret_file("secret-0644", 0644, SECRET "\n");
    snprintf(file_var, sizeof file_var, "DTRAIN_RDZV_SECRET_FILE=%s", path);
    const char *v[] = {file_var, NULL};
    CHECK_INT_EQ(wait_exit(start_rank("bad-mode", 0, 2, proc_free_port(), "bad", v, NULL, "2"), "bad-mode"), 2);
    CHECK_STR_CONTAINS(err_text, path);
    CHECK_STR_CONTAINS(err_text, "chmod 600");
    snprintf(file_var, sizeof file_var, "DTRAIN_RDZV_SECRET_FILE=%s", test_path("no-such-file"));
    CHECK_INT_EQ(wait_exit(start_rank("bad-missing", 0, 2, proc_free_port(), "bad", v, NULL, "2"), "bad-missing"), 2);
    CHECK_STR_CONTAINS(err_text, "no-such-file");
    const char *shortv[] = {"DTRAIN_RDZV_SECRET=short", NULL};
    CHECK_INT_EQ(wait_exit(start_rank("bad-short", 0, 2, proc_free_port(), "bad", shortv, NULL, "2"), "bad-short"), 2);
    CHECK_STR_CONTAINS(err_text, "DTRAIN_RDZV_SECRET is shorter than 16 characters");
    snprintf(both, sizeof both, "DTRAIN_RDZV_SECRET_FILE=%s", secret_file("secret-ok", 0600, SECRET));
    const char *twov[] = {"DTRAIN_RDZV_SECRET=" SECRET, both, NULL};
    CHECK_INT_EQ(wait_exit(start_rank("bad-both", 0, 2, proc_free_port(), "bad", twov, NULL, "2"), "bad-both"), 2);
    CHECK_STR_CONTAINS(err_text, "set only one of DTRAIN_RDZV_SECRET and DTRAIN_RDZV_SECRET_FILE");
    /* set but empty (a variable that did not expand): refused, not taken for "no secret" */
    const char *emptyv[] = {"DTRAIN_RDZV_SECRET=", NULL};
    CHECK_INT_EQ(wait_exit(start_rank("bad-empty", 0, 2, proc_free_port(), "bad", emptyv, NULL, "2"), "bad-empty"), 2);
    CHECK_STR_CONTAINS(err_text, "environment: DTRAIN_RDZV_SECRET is set but empty");
    CHECK(strstr(err_text, "warning: the rendezvous") == NULL);
    const char *emptyf[] = {"DTRAIN_RDZV_SECRET_FILE=", NULL};
    CHECK_INT_EQ(wait_exit(start_rank("bad-emptyf", 0, 2, proc_free_port(), "bad", emptyf, NULL, "2"), "bad-emptyf"), 2);
    CHECK_STR_CONTAINS(err_text, "environment: DTRAIN_RDZV_SECRET_FILE is set but empty");
    /* and on a rank that joins (not rank 0) too, beside a good secret in the other variable */
    const char *emptyj[] = {"DTRAIN_RDZV_SECRET=", both, NULL};
    CHECK_INT_EQ(wait_exit(start_rank("bad-emptyj", 1, 2, proc_free_port(), "bad", emptyj, NULL, "2"), "bad-emptyj"), 2);
    CHECK_STR_CONTAINS(err_text, "environment: DTRAIN_RDZV_SECRET is set but empty");
    check_no_escape_and_no_secret("bad-mode");
    check_no_escape_and_no_secret("bad-both");
}

/* a fake rank 0 whose answer is an ERR line full of terminal escapes */
static void test_err_sanitised(void) {
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    CHECK(lfd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 4) == 0);
    socklen_t len = sizeof sa;
    CHECK(getsockname(lfd, (struct sockaddr *)&sa, &len) == 0);
    pid_t p1 = start_rank("esc-r1", 1, 2, ntohs(sa.sin_port), "esc", NULL, NULL, "10");
    int c = accept(lfd, NULL, NULL);
    CHECK(c >= 0);
    send_text(c, "ERR evil \x1b[2J\x1b]0;title\x07 done\n");
    CHECK_INT_EQ(wait_exit(p1, "esc-r1"), 2);
    CHECK_STR_CONTAINS(err_text, "rank 0 refused rank 1: evil ?[2J?]0;title? done");
    check_no_escape_and_no_secret("esc-r1");
    close(c);
    close(lfd);
}

/* no secret: the job works as before, with one warning naming the variables */
static void test_no_secret(void) {
    int port = proc_free_port();
    pid_t p0 = start_rank("open-r0", 0, 2, port, "open", NULL, NULL, "20");
    pid_t p1 = start_rank("open-r1", 1, 2, port, "open", NULL, NULL, "20");
    CHECK_INT_EQ(wait_exit(p1, "open-r1"), 0);
    CHECK_INT_EQ(wait_exit(p0, "open-r0"), 0);
    CHECK_STR_CONTAINS(err_text, "dtrain: warning: the rendezvous at 127.0.0.1:");
    CHECK_STR_CONTAINS(err_text, "set DTRAIN_RDZV_SECRET (or DTRAIN_RDZV_SECRET_FILE)");
    const char *w = strstr(err_text, "warning: the rendezvous");
    CHECK(w && !strstr(w + 1, "warning: the rendezvous")); /* once */
}

/* every case, or the one named on the command line */
int main(int argc, char **argv) {
    static const struct {
        const char *name;
        void (*fn)(void);
    } cases[] = {{"bad_secrets", test_bad_secrets}, {"err_sanitised", test_err_sanitised}, {"no_secret", test_no_secret},
                 {"one_sided", test_one_sided},     {"impostors", test_impostors},         {"idle", test_idle},
                 {"other_config", test_other_config}, {"ring", test_ring}, {"flood", test_flood},
                 {"name_is_loopback", test_name_is_loopback}};
    test_dir_init("rdzv-auth");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (argc < 2 || strcmp(argv[1], cases[i].name) == 0) {
            printf("--- %s\n", cases[i].name);
            cases[i].fn();
        }
    test_dir_remove();
    TEST_PASS("test_rdzv_auth");
}
