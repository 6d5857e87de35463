/* fake_gpus.c — linked into the mock dtrain and test_ops_backends: the registry counts GPUs by
 * listing /proc/driver/nvidia/gpus (src/ops/backend.c, without initialising CUDA); this opendir() lists
 * $MOCK_GPUS_DIR instead (run-test.sh makes it with one entry, for the one mock device).
 * Every other path, and that one when MOCK_GPUS_DIR is unset, goes to the C library. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

DIR *opendir(const char *name) {
    static DIR *(*real)(const char *);
    if (!real) real = (DIR * (*)(const char *)) dlsym(RTLD_NEXT, "opendir");
    const char *fake = getenv("MOCK_GPUS_DIR");
    if (fake && strcmp(name, "/proc/driver/nvidia/gpus") == 0) return real(fake);
    return real(name);
}
