/* fake_nvml.c — libnvidia-ml.so.1 for the tests: the NVML calls src/io/nvml.c makes, over GPUs
 * described by the environment, read at nvmlInit:
 *
 *   FAKE_NVML_GPUS="BUSID=UTIL/USED_MB/TOTAL_MB/TEMP_C/POWER_W;BUSID=..."
 *       one GPU per entry, NVML index = its position; TEMP_C or POWER_W "-": not supported
 *       (NVML_ERROR_NOT_SUPPORTED); UTIL "x": the utilisation query fails (NVML_ERROR_UNKNOWN)
 *   FAKE_NVML_INIT=fail  nvmlInit_v2 returns NVML_ERROR_DRIVER_NOT_LOADED
 *
 * Built by CMake for test_nvml (build/fakenvml/) and by tests/mockgpu/Makefile for the mock
 * dtrain's GPU-monitoring run (run-test.sh). Bus ids compare case-insensitively. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef int nvmlReturn_t;
typedef struct fake_gpu *nvmlDevice_t;
typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;
enum { OK = 0, ERR_INVALID_ARGUMENT = 2, ERR_NOT_SUPPORTED = 3, ERR_NOT_FOUND = 6, ERR_DRIVER_NOT_LOADED = 9,
       ERR_UNINITIALIZED = 1, ERR_UNKNOWN = 999 };

struct fake_gpu {
    char bus[64];
    int util; /* -1: the query fails */
    double used_mb, total_mb;
    int temp, power; /* -1: not supported */
};

static struct fake_gpu gpus[16];
static int n_gpus, inited;

nvmlReturn_t nvmlInit_v2(void) {
    const char *mode = getenv("FAKE_NVML_INIT");
    if (mode && strcmp(mode, "fail") == 0) return ERR_DRIVER_NOT_LOADED;
    n_gpus = 0;
    const char *spec = getenv("FAKE_NVML_GPUS");
    char buf[2048];
    snprintf(buf, sizeof buf, "%s", spec ? spec : "");
    char *save = NULL;
    for (char *e = strtok_r(buf, ";", &save); e && n_gpus < 16; e = strtok_r(NULL, ";", &save)) {
        struct fake_gpu *g = &gpus[n_gpus];
        char util[16], temp[16], power[16];
        if (sscanf(e, "%63[^=]=%15[^/]/%lf/%lf/%15[^/]/%15s", g->bus, util, &g->used_mb, &g->total_mb, temp, power) != 6)
            continue;
        g->util = util[0] == 'x' ? -1 : atoi(util);
        g->temp = temp[0] == '-' ? -1 : atoi(temp);
        g->power = power[0] == '-' ? -1 : atoi(power);
        n_gpus++;
    }
    inited = 1;
    return OK;
}

nvmlReturn_t nvmlShutdown(void) {
    inited = 0;
    return OK;
}

const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case OK: return "Success";
    case ERR_UNINITIALIZED: return "Uninitialized";
    case ERR_INVALID_ARGUMENT: return "Invalid Argument";
    case ERR_NOT_SUPPORTED: return "Not Supported";
    case ERR_NOT_FOUND: return "Not Found";
    case ERR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, nvmlDevice_t *d) {
    if (!inited) return ERR_UNINITIALIZED;
    if (!bus || !d) return ERR_INVALID_ARGUMENT;
    for (int i = 0; i < n_gpus; i++)
        if (strcasecmp(gpus[i].bus, bus) == 0) {
            *d = &gpus[i];
            return OK;
        }
    return ERR_NOT_FOUND;
}

static int valid(nvmlDevice_t d) { return inited && d >= gpus && d < gpus + n_gpus; }

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    if (!valid(d)) return ERR_INVALID_ARGUMENT;
    *index = (unsigned int)(d - gpus);
    return OK;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    if (!valid(d)) return ERR_INVALID_ARGUMENT;
    if (d->util < 0) return ERR_UNKNOWN;
    u->gpu = (unsigned int)d->util;
    u->memory = (unsigned int)d->util / 2;
    return OK;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    if (!valid(d)) return ERR_INVALID_ARGUMENT;
    m->total = (unsigned long long)(d->total_mb * 1048576.0);
    m->used = (unsigned long long)(d->used_mb * 1048576.0);
    m->free = m->total - m->used;
    return OK;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *t) {
    if (!valid(d) || sensor != 0) return ERR_INVALID_ARGUMENT;
    if (d->temp < 0) return ERR_NOT_SUPPORTED;
    *t = (unsigned int)d->temp;
    return OK;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *mw) {
    if (!valid(d)) return ERR_INVALID_ARGUMENT;
    if (d->power < 0) return ERR_NOT_SUPPORTED;
    *mw = (unsigned int)d->power * 1000u;
    return OK;
}
