/* proc.h — running the real dtrain binary from tests: spawn with stdout/stderr captured
 * in the test dir, wait and read stderr, find a worker by name, poll for a process; clear the
 * launchers' variables and pick a free port for a rendezvous. */
#ifndef DTRAIN_TEST_PROC_H
#define DTRAIN_TEST_PROC_H

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "testutil.h"

extern char **environ;

/* No launcher's variables (torchrun, Open MPI, Slurm, PMIx, an Indexed Job) nor a rendezvous
 * secret from the environment the tests run in (e.g. inside srun). */
static inline void proc_clear_launcher_env(void) {
    static const char *const vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                       "MASTER_PORT", "JOB_COMPLETION_INDEX", "DTRAIN_RDZV_SECRET",
                                       "DTRAIN_RDZV_SECRET_FILE", NULL};
    for (int i = 0; vars[i]; i++) unsetenv(vars[i]);
    for (int again = 1; again;) {
        again = 0;
        for (char **e = environ; *e; e++)
            if (strncmp(*e, "SLURM_", 6) == 0 || strncmp(*e, "OMPI_", 5) == 0 || strncmp(*e, "PMIX_", 5) == 0 ||
                strncmp(*e, "TORCHELASTIC_", 13) == 0) {
                char name[128];
                snprintf(name, sizeof name, "%.*s", (int)strcspn(*e, "="), *e);
                unsetenv(name);
                again = 1;
                break;
            }
    }
}

/* A loopback port that was free a moment ago (for MASTER_PORT). */
static inline int proc_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0);
    socklen_t len = sizeof sa;
    CHECK(getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
    close(fd);
    return ntohs(sa.sin_port);
}

static char err_text[1 << 16];

/* Starts `prog` (a path) with the given arguments (NULL-terminated), stdout/stderr to
 * TAG.out/TAG.err in the test dir, working directory the source dir. Returns the pid. */
static inline pid_t spawn_prog(const char *tag, const char *prog, const char *const *args) {
    char *argv[64];
    int n = 0;
    argv[n++] = (char *)prog;
    for (int i = 0; args[i]; i++) argv[n++] = (char *)args[i];
    argv[n] = NULL;
    char out[1300], err[1300];
    snprintf(out, sizeof out, "%s/%s.out", test_dir(), tag);
    snprintf(err, sizeof err, "%s/%s.err", test_dir(), tag);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, err, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(chdir(DTRAIN_SOURCE_DIR) == 0);
    pid_t pid;
    CHECK(posix_spawn(&pid, prog, &fa, NULL, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    printf("started %s (pid %ld)\n", tag, (long)pid);
    return pid;
}

/* dtrain itself */
static inline pid_t spawn(const char *tag, const char *const *args) { return spawn_prog(tag, DTRAIN_BIN, args); }

static inline int wait_exit(pid_t pid, const char *tag) {
    int st;
    CHECK(waitpid(pid, &st, 0) == pid);
    char err[1300];
    snprintf(err, sizeof err, "%s/%s.err", test_dir(), tag);
    test_slurp(err, err_text, sizeof err_text);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    printf("%s exited %d; stderr: %s\n", tag, rc, err_text);
    return rc;
}

static inline int run_sync(const char *tag, const char *const *args) { return wait_exit(spawn(tag, args), tag); }

/* what run `tag` printed on stdout (TAG.out in the test dir) into buf(n) */
static inline void slurp_stdout(const char *tag, char *buf, size_t n) {
    char path[1300];
    snprintf(path, sizeof path, "%s/%s.out", test_dir(), tag);
    test_slurp(path, buf, n);
}

/* pid of the child of `parent` whose name (comm) is `name`, or 0 */
static inline pid_t find_child(pid_t parent, const char *name) {
    DIR *d = opendir("/proc");
    CHECK(d != NULL);
    struct dirent *e;
    pid_t found = 0;
    while (!found && (e = readdir(d)) != NULL) {
        char path[300], buf[512];
        if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t k = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[k] = '\0';
        char *open = strchr(buf, '('), *close = strrchr(buf, ')');
        if (!open || !close) continue;
        *close = '\0';
        long ppid = 0;
        char state;
        if (sscanf(close + 2, "%c %ld", &state, &ppid) != 2) continue;
        if (ppid == parent && strcmp(open + 1, name) == 0) found = (pid_t)atol(e->d_name);
    }
    closedir(d);
    return found;
}

static inline int alive(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%ld", (long)pid);
    return access(path, F_OK) == 0;
}

static inline int count_dir(const char *path) {
    DIR *d = opendir(path);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

static inline void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Sends `sig` to `target`, waits for `pid` (tag: its output files) and returns its exit
 * status; *seconds (may be NULL) receives the time from the signal to the exit. */
static inline int signal_and_wait(pid_t target, int sig, pid_t pid, const char *tag, double *seconds) {
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    CHECK(kill(target, sig) == 0);
    int rc = wait_exit(pid, tag);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double dt = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    printf("%s: exited %.2f s after signal %d\n", tag, dt, sig);
    if (seconds) *seconds = dt;
    return rc;
}

#endif
