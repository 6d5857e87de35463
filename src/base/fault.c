/* fault.c — DTRAIN_FAULT and the DTRAIN_TEST_* hooks, the testing aids (include/dtrain/fault.h). */
#include "dtrain/fault.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *const kind_names[] = {"none", "kill", "exit", "hang", "corrupt-checkpoint"};

static int parse_long(const char *s, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0) return 0;
    *out = v;
    return 1;
}

dt_status dt_fault_parse(const char *spec, dt_fault *out) {
    memset(out, 0, sizeof *out);
    if (!spec || !*spec) return DT_OK;
    char buf[256];
    if (strlen(spec) >= sizeof buf)
        return dt_error_set(DT_ERR_USAGE, "DTRAIN_FAULT: too long (expected rank=R,step=S,kind=K[,attempt=A|any])");
    snprintf(buf, sizeof buf, "%s", spec);
    int have_rank = 0, have_step = 0;
    char *save = NULL;
    for (char *item = strtok_r(buf, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(item, '=');
        if (!eq)
            return dt_error_set(DT_ERR_USAGE, "DTRAIN_FAULT: \"%s\": expected key=value (rank=R,step=S,kind=K[,attempt=A])",
                                item);
        *eq = '\0';
        const char *key = item, *val = eq + 1;
        long v;
        if (strcmp(key, "kind") == 0) {
            out->kind = DT_FAULT_NONE;
            for (int k = DT_FAULT_KILL; k <= DT_FAULT_CORRUPT_CKPT; k++)
                if (strcmp(val, kind_names[k]) == 0) out->kind = (dt_fault_kind)k;
            if (out->kind == DT_FAULT_NONE)
                return dt_error_set(DT_ERR_USAGE,
                                    "DTRAIN_FAULT: kind: expected kill, exit, hang or corrupt-checkpoint, got \"%s\"", val);
        } else if (strcmp(key, "attempt") == 0 && strcmp(val, "any") == 0) {
            out->attempt = DT_FAULT_ANY_ATTEMPT;
        } else if (strcmp(key, "rank") == 0 || strcmp(key, "step") == 0 || strcmp(key, "attempt") == 0) {
            if (!parse_long(val, &v) || v > 1000000000L)
                return dt_error_set(DT_ERR_USAGE, "DTRAIN_FAULT: %s: expected a non-negative integer, got \"%s\"", key, val);
            if (key[0] == 'r') { out->rank = (int)v; have_rank = 1; }
            else if (key[0] == 's') { out->step = v; have_step = 1; }
            else out->attempt = (int)v;
        } else {
            return dt_error_set(DT_ERR_USAGE, "DTRAIN_FAULT: unknown key \"%s\" (expected rank, step, kind, attempt)", key);
        }
    }
    if (out->kind == DT_FAULT_NONE || !have_step || (!have_rank && out->kind != DT_FAULT_CORRUPT_CKPT)) {
        out->kind = DT_FAULT_NONE;
        return dt_error_set(DT_ERR_USAGE, "DTRAIN_FAULT: \"%s\": needs rank=R,step=S,kind=K", spec);
    }
    if (out->step < 1) return dt_error_set(DT_ERR_USAGE, "DTRAIN_FAULT: step: expected >= 1 (steps count from 1)");
    return DT_OK;
}

dt_status dt_fault_from_env(dt_fault *out) { return dt_fault_parse(getenv("DTRAIN_FAULT"), out); }

static int attempt_matches(const dt_fault *f, int attempt) {
    return f->attempt == DT_FAULT_ANY_ATTEMPT || f->attempt == attempt;
}

void dt_fault_before_step(const dt_fault *f, int rank, int attempt, long step) {
    if (f->kind == DT_FAULT_NONE || f->kind == DT_FAULT_CORRUPT_CKPT || f->rank != rank || !attempt_matches(f, attempt) ||
        f->step != step)
        return;
    fprintf(stderr, "DTRAIN_FAULT: rank %d, step %ld: injecting \"%s\"\n", rank, step, kind_names[f->kind]);
    fflush(NULL);
    switch (f->kind) {
    case DT_FAULT_KILL: raise(SIGKILL); break;
    case DT_FAULT_EXIT: _exit(3);
    case DT_FAULT_HANG: raise(SIGSTOP); break; /* continues only when someone sends SIGCONT */
    default: break;
    }
}

dt_status dt_fault_after_checkpoint(const dt_fault *f, int attempt, long step, const char *ckpt_dir) {
    if (f->kind != DT_FAULT_CORRUPT_CKPT || !attempt_matches(f, attempt) || f->step != step) return DT_OK;
    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", ckpt_dir);
    int fd = open(path, O_RDWR);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) != 0 || sb.st_size < 2) {
        if (fd >= 0) close(fd);
        return dt_error_set(DT_ERR_IO, "DTRAIN_FAULT: cannot corrupt %s: %s", path, strerror(errno));
    }
    off_t at = sb.st_size / 2;
    unsigned char c = 0;
    int ok = pread(fd, &c, 1, at) == 1;
    c ^= 0x10;
    ok = ok && pwrite(fd, &c, 1, at) == 1;
    close(fd);
    if (!ok) return dt_error_set(DT_ERR_IO, "DTRAIN_FAULT: cannot corrupt %s: %s", path, strerror(errno));
    fprintf(stderr, "DTRAIN_FAULT: flipped one byte of %s at offset %lld\n", path, (long long)at);
    return DT_OK;
}

/* an integer rank from the environment variable `name`, or -1 when unset or not an integer */
static int env_rank(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    char *end;
    long r = strtol(v, &end, 10);
    return *end == '\0' && r >= 0 && r < DT_MAX_WORLD ? (int)r : -1;
}

int dt_fault_break_allreduce(int rank) {
    if (env_rank("DTRAIN_TEST_BREAK_ALLREDUCE") != rank) return 0;
    fprintf(stderr, "dtrain: rank %d: DTRAIN_TEST_BREAK_ALLREDUCE is set: this rank's all-reduce results are "
                    "deliberately wrong (test switch)\n", rank);
    return 1;
}

int dt_fault_perturb_replica_rank(void) { return env_rank("DTRAIN_TEST_PERTURB_REPLICA"); }

int dt_fault_device_comm_alone(void) {
    const char *v = getenv("DTRAIN_TEST_DEVICE_COMM");
    if (!v || strcmp(v, "1") != 0) return 0;
    fprintf(stderr, "dtrain: DTRAIN_TEST_DEVICE_COMM is set: one worker's gradients go through the device's collective "
                    "(test switch)\n");
    return 1;
}

FILE *dt_fault_sample_log(int rank) {
    const char *dir = getenv("DTRAIN_TEST_SAMPLE_LOG");
    if (!dir || !*dir) return NULL;
    char path[4096 + 64];
    snprintf(path, sizeof path, "%s/samples-rank-%d.txt", dir, rank);
    return fopen(path, "a");
}
