/* launch.c — fork one worker per rank, supervise, stop everyone when one fails.
 *
 * Parent:  status block + shm world (anonymous shared mappings) -> fork N -> poll waitpid
 *          every 20 ms -> on the first failure: abort the collective, SIGTERM (+SIGCONT) the
 *          rest, SIGKILL after a grace period -> reap all -> one message.
 * Child:   PR_SET_PDEATHSIG, name "dtrain-rN", default signal dispositions, logs, comm,
 *          fn() -> message into the status block -> _exit(code). */
#include "dtrain/launch.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORLD 64
#define MSG_LEN 1024
#define POLL_NS 20000000L   /* 20 ms between waitpid polls */
#define GRACE_S 3.0         /* SIGTERM -> SIGKILL */

typedef struct rank_slot {
    _Atomic int has_msg;
    char msg[MSG_LEN];
} rank_slot;

static volatile sig_atomic_t g_signal; /* SIGINT/SIGTERM received by the launcher */

static void on_signal(int sig) { g_signal = sig; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* rank-N.log in the log dir; "" when there is none */
static void log_path(const dt_launch_cfg *cfg, int rank, char *buf, size_t n) {
    if (cfg->log_dir) snprintf(buf, n, "%s/rank-%d.log", cfg->log_dir, rank);
    else if (n) buf[0] = '\0';
}

/* ---- child ---- */

static void append_log(const char *path, const char *line) {
    if (!path[0]) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    fprintf(f, "%s\n", line);
    fclose(f);
}

static void child_main(const dt_launch_cfg *cfg, int rank, pid_t parent, dt_shm_world *world, rank_slot *slot,
                       dt_launch_fn fn, void *arg) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1); /* the launcher died before we got here */
    char name[16];
    snprintf(name, sizeof name, "dtrain-r%d", rank);
    prctl(PR_SET_NAME, name);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);

    char log[1200];
    log_path(cfg, rank, log, sizeof log);
    if (rank != 0) { /* only rank 0 speaks on the console */
        int fd = open(log[0] ? log : "/dev/null", O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) {
            dup2(null, STDIN_FILENO);
            close(null);
        }
    }
    char line[MSG_LEN + 64];
    snprintf(line, sizeof line, "rank %d of %d: pid %ld, %s", rank, cfg->world, (long)getpid(), cfg->what);
    append_log(log, line);

    dt_comm *comm = NULL;
    dt_status st = dt_comm_init_shm(&comm, world, rank, cfg->timeout_s);
    if (st == DT_OK) st = fn(arg, comm);
    if (st != DT_OK) {
        snprintf(slot->msg, sizeof slot->msg, "%s", dt_error_msg());
        atomic_store(&slot->has_msg, 1);
        snprintf(line, sizeof line, "error: %s", dt_error_msg());
        append_log(log, line);
    }
    dt_comm_free(comm);
    fflush(NULL);
    _exit(dt_status_exit_code(st));
}

/* ---- parent ---- */

typedef struct child {
    pid_t pid;
    int alive;
} child;

static void signal_all(child *kids, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (kids[r].alive) kill(kids[r].pid, sig);
}

static void describe_exit(int status, char *buf, size_t n) {
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char *abbrev = sigabbrev_np(sig);
        snprintf(buf, n, "was killed by signal %d (SIG%s)", sig, abbrev ? abbrev : "?");
    } else {
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    }
}

dt_status dt_launch_run(const dt_launch_cfg *cfg, dt_launch_fn fn, void *arg) {
    if (cfg->world < 1 || cfg->world > MAX_WORLD)
        return dt_error_set(DT_ERR_CONFIG, "training.num_workers: expected 1..%d on one machine, got %d", MAX_WORLD,
                            cfg->world);
    const int n = cfg->world;
    dt_shm_world *world = NULL;
    DT_TRY(dt_shm_world_create(&world, n, 0));
    size_t slots_bytes = sizeof(rank_slot) * (size_t)n;
    rank_slot *slots = mmap(NULL, slots_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (slots == MAP_FAILED) {
        dt_shm_world_destroy(world);
        return dt_error_set(DT_ERR_NOMEM, "cannot map the worker status block: %s", strerror(errno));
    }
    memset(slots, 0, slots_bytes);
    child kids[MAX_WORLD];
    memset(kids, 0, sizeof kids);

    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    g_signal = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);

    dt_status st = DT_OK;
    char msg[MSG_LEN + 256] = "";
    int failed_rank = -1;
    double stop_deadline = 0; /* > 0: stopping; SIGKILL after it */
    int alive = 0;

    fflush(NULL); /* nothing buffered may be written twice */
    const pid_t parent = getpid();
    for (int r = 0; r < n; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            st = dt_error_set(DT_ERR_INTERNAL, "cannot start worker %d: fork: %s", r, strerror(errno));
            failed_rank = r;
            stop_deadline = now_s() + GRACE_S;
            dt_shm_world_abort(world, "the launcher could not start every worker");
            signal_all(kids, r, SIGTERM);
            break;
        }
        if (pid == 0) child_main(cfg, r, parent, world, &slots[r], fn, arg);
        kids[r].pid = pid;
        kids[r].alive = 1;
        alive++;
    }

    int forwarded = 0;
    while (alive > 0) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            int r = 0;
            while (r < n && kids[r].pid != pid) r++;
            if (r == n) continue;
            kids[r].alive = 0;
            alive--;
            int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
            if (!ok && failed_rank < 0 && !g_signal) {
                failed_rank = r;
                char how[128], log[1200];
                describe_exit(status, how, sizeof how);
                log_path(cfg, r, log, sizeof log);
                char see[1300] = "";
                if (log[0]) snprintf(see, sizeof see, " (log: %s)", log);
                if (atomic_load(&slots[r].has_msg) && WIFEXITED(status)) {
                    if (n > 1) snprintf(msg, sizeof msg, "rank %d: %s%s", r, slots[r].msg, see);
                    else snprintf(msg, sizeof msg, "%s", slots[r].msg);
                    st = WEXITSTATUS(status) == 2 ? DT_ERR_CONFIG : DT_ERR_INTERNAL;
                } else {
                    snprintf(msg, sizeof msg, "worker rank %d %s during %s%s", r, how, cfg->what, see);
                    st = DT_ERR_INTERNAL;
                }
                char why[160];
                snprintf(why, sizeof why, "rank %d %s", r, how);
                dt_shm_world_abort(world, why);
                signal_all(kids, n, SIGTERM);
                signal_all(kids, n, SIGCONT);
                stop_deadline = now_s() + GRACE_S;
            }
            continue;
        }
        if (pid < 0 && errno != EINTR) {
            st = dt_error_set(DT_ERR_INTERNAL, "waitpid: %s", strerror(errno));
            break;
        }
        if (g_signal && !forwarded) {
            forwarded = 1;
            snprintf(msg, sizeof msg, "interrupted by SIG%s: stopped %d worker(s)", sigabbrev_np(g_signal), n);
            st = DT_ERR_INTERRUPTED;
            dt_shm_world_abort(world, "the launcher was interrupted");
            signal_all(kids, n, g_signal);
            signal_all(kids, n, SIGCONT);
            stop_deadline = now_s() + GRACE_S;
        }
        if (stop_deadline > 0 && now_s() > stop_deadline) {
            signal_all(kids, n, SIGKILL);
            stop_deadline = now_s() + 3600; /* SIGKILL cannot be ignored: just reap */
        }
        struct timespec ts = {0, POLL_NS};
        nanosleep(&ts, NULL);
    }
    /* reap anything left (only after a waitpid error) */
    for (int r = 0; r < n; r++)
        if (kids[r].alive) {
            kill(kids[r].pid, SIGKILL);
            waitpid(kids[r].pid, NULL, 0);
        }

    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    munmap(slots, slots_bytes);
    dt_shm_world_destroy(world);
    if (st != DT_OK && msg[0]) dt_error_set(st, "%s", msg);
    return st;
}
