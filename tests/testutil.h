/* testutil.h — files for tests: a per-run scratch directory under DTRAIN_TEST_TMP, paths
 * in it, writing a file, removing the tree. Failures stop the test through CHECK. */
#ifndef DTRAIN_TEST_UTIL_H
#define DTRAIN_TEST_UTIL_H

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"

static inline char *test_dir(void) {
    static char dir[1024];
    return dir;
}

static inline void test_mkdir_p(const char *path) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        CHECK(mkdir(buf, 0755) == 0 || errno == EEXIST);
        *p = '/';
    }
    CHECK(mkdir(buf, 0755) == 0 || errno == EEXIST);
}

/* Creates DTRAIN_TEST_TMP/<prefix>-<pid> and makes it the directory of test_path(). */
static inline const char *test_dir_init(const char *prefix) {
    snprintf(test_dir(), 1024, "%s/%s-%ld", DTRAIN_TEST_TMP, prefix, (long)getpid());
    test_mkdir_p(test_dir());
    return test_dir();
}

/* test_dir()/name; the last 8 results stay valid. */
static inline const char *test_path(const char *name) {
    static char bufs[8][1200];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", test_dir(), name);
    return b;
}

static inline void test_write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    CHECK(fwrite(data, 1, len, f) == len);
    CHECK(fclose(f) == 0);
}

/* Reads up to n-1 bytes of `path` into buf, NUL-terminated ("" when it cannot be read). */
static inline void test_slurp(const char *path, char *buf, size_t n) {
    FILE *f = fopen(path, "rb");
    size_t k = 0;
    if (f) {
        k = fread(buf, 1, n - 1, f);
        fclose(f);
    }
    buf[k] = '\0';
}

static inline int test_rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(path);
}

/* Removes test_dir() and everything in it (call only when the test passed, so that a
 * failure leaves its files to look at). */
static inline void test_dir_remove(void) {
    CHECK(nftw(test_dir(), test_rm_entry, 16, FTW_DEPTH | FTW_PHYS) == 0);
}

/* The model.safetensors of two runs in test_dir() are byte-identical. */
/* A link planted at a writer's temporary name for `out` (OUT.tmp.PID) pointing at a file
 * holding "keep me"; tmp receives that name. test_planted_kept() then checks that the target
 * kept its bytes and the link is still there, untouched. */
static inline void test_plant_temp_link(const char *out, const char *victim, char *tmp, size_t n) {
    test_write_file(victim, "keep me", 7);
    snprintf(tmp, n, "%s.tmp.%ld", out, (long)getpid());
    CHECK(symlink(victim, tmp) == 0);
}
static inline void test_planted_kept(const char *victim, const char *tmp) {
    char got[64];
    test_slurp(victim, got, sizeof got);
    CHECK_STR_EQ(got, "keep me");
    struct stat sb;
    CHECK(lstat(tmp, &sb) == 0 && S_ISLNK(sb.st_mode)); /* not ours: left where it was */
}

static inline void test_same_weights(const char *run_a, const char *run_b) {
    char pa[1300], pb[1300];
    snprintf(pa, sizeof pa, "%s/%s/model.safetensors", test_dir(), run_a);
    snprintf(pb, sizeof pb, "%s/%s/model.safetensors", test_dir(), run_b);
    struct stat sa, sb;
    CHECK(stat(pa, &sa) == 0 && stat(pb, &sb) == 0);
    CHECK(sa.st_size > 0);
    CHECK_INT_EQ(sa.st_size, sb.st_size);
    size_t n = (size_t)sa.st_size;
    char *a = malloc(n), *b = malloc(n);
    FILE *fa = fopen(pa, "rb"), *fb = fopen(pb, "rb");
    CHECK(a && b && fa && fb);
    CHECK(fread(a, 1, n, fa) == n && fread(b, 1, n, fb) == n);
    fclose(fa);
    fclose(fb);
    CHECK(memcmp(a, b, n) == 0);
    printf("%s and %s: model.safetensors identical (%zu bytes)\n", run_a, run_b, n);
    free(a);
    free(b);
}

#endif
