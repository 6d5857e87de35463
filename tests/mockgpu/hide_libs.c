/* hide_libs.c — libhidelibs.so, for LD_PRELOAD: a library that is not installed, although the
 * machine has it (run-test.sh: dtrain's GPU worker without cuBLASLt, where the mock's
 * libcublasLt.so.13 is next to dtrain and a real one may be in the ld cache).
 *
 * MOCK_HIDE_LIBS: sonames separated by ':' (e.g. libcublasLt.so.13). dlopen of one of them
 * (by that name, or a path ending in "/NAME") fails as glibc's does for a library it cannot
 * find: NULL, and dlerror() says "NAME: cannot open shared object file: No such file or
 * directory" once. Every other dlopen and dlerror is glibc's (found with RTLD_NEXT; the search
 * then starts from this library, without the caller's RUNPATH: keep the mocks' folder on
 * LD_LIBRARY_PATH, as run-test.sh does). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static __thread char hide_msg[512];
static __thread int hide_pending; /* a hidden dlopen failed since the last dlerror() */

static int hidden(const char *file) {
    const char *list = getenv("MOCK_HIDE_LIBS");
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;
    for (const char *p = list; p && *p;) {
        size_t n = strcspn(p, ":");
        if (n && strlen(base) == n && strncmp(base, p, n) == 0) return 1;
        p += n + (p[n] == ':');
    }
    return 0;
}

void *dlopen(const char *file, int mode) {
    static void *(*real)(const char *, int);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "dlopen");
    if (file && hidden(file)) {
        snprintf(hide_msg, sizeof hide_msg, "%s: cannot open shared object file: No such file or directory", file);
        hide_pending = 1;
        return NULL;
    }
    hide_pending = 0;
    return real(file, mode);
}

char *dlerror(void) {
    static char *(*real)(void);
    if (!real) *(void **)&real = dlsym(RTLD_NEXT, "dlerror");
    if (hide_pending) {
        hide_pending = 0;
        return hide_msg;
    }
    return real();
}
