/* fuzz_util.h — what the fuzz targets share (tests/fuzz/README.md): a private scratch
 * directory for the files a loader reads from a path, writing the input into it, and
 * splitting one input into the several files of a checkpoint. */
#ifndef DTRAIN_FUZZ_UTIL_H
#define DTRAIN_FUZZ_UTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/status.h"

/* libFuzzer's entry points (the runtime calls them; declared here for -Wmissing-prototypes) */
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A failed check in a harness is a finding: abort() so that libFuzzer saves the input. */
#define FUZZ_ASSERT(cond, ...)                                          \
    do {                                                                \
        if (!(cond)) {                                                  \
            fprintf(stderr, "fuzz: %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                               \
            fprintf(stderr, "\n");                                      \
            abort();                                                    \
        }                                                               \
    } while (0)

static char fuzz_dir[512] __attribute__((unused));

/* DTRAIN_FUZZ_DEBUG=1: say what the loader made of the input (to check a new seed reaches
 * what it is meant for: ./fuzz_config seeds/config/x.yaml). */
static inline void fuzz_debug(const char *what, dt_status st) {
    static int on = -1;
    if (on < 0) on = getenv("DTRAIN_FUZZ_DEBUG") != NULL;
    if (on) fprintf(stderr, "fuzz: %s: %s%s%s\n", what, dt_status_str(st), st ? ": " : "", st ? dt_error_msg() : "");
}

static inline void fuzz_rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
            char p[1024];
            snprintf(p, sizeof p, "%s/%s", path, e->d_name);
            fuzz_rm_tree(p);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static inline void fuzz_dir_remove(void) {
    if (fuzz_dir[0]) fuzz_rm_tree(fuzz_dir);
}

/* Creates this process's scratch directory, removed at exit (not after a crash: run.sh gives
 * every run a DTRAIN_FUZZ_TMP that it removes itself); else in /dev/shm when it is there (no
 * disk writes per input). */
static inline const char *fuzz_scratch(void) {
    if (fuzz_dir[0]) return fuzz_dir;
    const char *base = getenv("DTRAIN_FUZZ_TMP");
    if (!base || !base[0])
        base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : (getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    snprintf(fuzz_dir, sizeof fuzz_dir, "%s/dtrain-fuzz.XXXXXX", base);
    if (!mkdtemp(fuzz_dir)) {
        perror("fuzz: mkdtemp");
        abort();
    }
    atexit(fuzz_dir_remove);
    return fuzz_dir;
}

/* Writes n bytes to path (replacing it); aborts when the scratch file system fails, which
 * is no finding of the loader's. */
static inline void fuzz_write(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) {
        perror(path);
        abort();
    }
}

/* One input as several files: the parts are separated by FUZZ_SEP. Sets up to max parts
 * (the rest of the input stays in the last one); returns how many there are. */
#define FUZZ_SEP "\n--8<--\n"
typedef struct fuzz_part {
    const uint8_t *p;
    size_t n;
} fuzz_part;

static inline int fuzz_split(const uint8_t *data, size_t size, fuzz_part *parts, int max) {
    size_t sep = strlen(FUZZ_SEP);
    int k = 0;
    const uint8_t *p = data, *end = data + size;
    while (k < max - 1) {
        const uint8_t *hit = (size_t)(end - p) >= sep ? memmem(p, (size_t)(end - p), FUZZ_SEP, sep) : NULL;
        if (!hit) break;
        parts[k++] = (fuzz_part){p, (size_t)(hit - p)};
        p = hit + sep;
    }
    parts[k++] = (fuzz_part){p, (size_t)(end - p)};
    for (int i = k; i < max; i++) parts[i] = (fuzz_part){end, 0};
    return k;
}

#endif
