/* nvml.c — GPU samples through NVML, opened with dlopen (include/dtrain/nvml.h).
 *
 * The few NVML declarations used are written out here (NVML's C ABI is stable; nvml.h is not
 * installed with every toolkit, and a CPU-only build has none): the return code is an int,
 * 0 = NVML_SUCCESS; a device handle is a pointer. */
#include "dtrain/nvml.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvml_ret;
typedef void *nvml_device;
typedef struct {
    unsigned int gpu, memory;
} nvml_utilization;
typedef struct {
    unsigned long long total, free, used;
} nvml_memory;
enum { NVML_SUCCESS = 0, NVML_TEMPERATURE_GPU = 0 };

#define NVML_FUNCS(X)                                                                     \
    X(nvml_ret, nvmlInit_v2, (void))                                                      \
    X(nvml_ret, nvmlShutdown, (void))                                                     \
    X(const char *, nvmlErrorString, (nvml_ret))                                          \
    X(nvml_ret, nvmlDeviceGetHandleByPciBusId_v2, (const char *, nvml_device *))          \
    X(nvml_ret, nvmlDeviceGetIndex, (nvml_device, unsigned int *))                        \
    X(nvml_ret, nvmlDeviceGetUtilizationRates, (nvml_device, nvml_utilization *))         \
    X(nvml_ret, nvmlDeviceGetMemoryInfo, (nvml_device, nvml_memory *))                    \
    X(nvml_ret, nvmlDeviceGetTemperature, (nvml_device, int, unsigned int *))             \
    X(nvml_ret, nvmlDeviceGetPowerUsage, (nvml_device, unsigned int *))

#define MAX_GPUS 64

struct dt_nvml {
#define X(ret, name, args) ret(*name) args;
    NVML_FUNCS(X)
#undef X
    int n;                     /* GPUs looked up so far */
    char bus[MAX_GPUS][32];    /* their bus ids, as asked */
    nvml_device dev[MAX_GPUS];
    int index[MAX_GPUS];
};

dt_status dt_nvml_open(const char *lib, dt_nvml **out) {
    *out = NULL;
    const char *name = lib ? lib : "libnvidia-ml.so.1";
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL); /* never closed: the driver's library */
    if (!h)
        return dt_error_set(DT_ERR_DEVICE, "cannot load %s (part of the NVIDIA driver): %s", name, dlerror());
    dt_nvml *nv = calloc(1, sizeof *nv);
    if (!nv) return dt_error_set(DT_ERR_NOMEM, "out of memory");
#define X(ret, fn, args)                                                                                       \
    if (!(*(void **)&nv->fn = dlsym(h, #fn))) {                                                                \
        free(nv);                                                                                              \
        return dt_error_set(DT_ERR_DEVICE, "%s has no symbol %s (an NVIDIA driver older than 2015?)", name, #fn); \
    }
    NVML_FUNCS(X)
#undef X
    nvml_ret rc = nv->nvmlInit_v2();
    if (rc != NVML_SUCCESS) {
        dt_status st = dt_error_set(DT_ERR_DEVICE, "%s: nvmlInit failed: %s (error %d)", name,
                                    nv->nvmlErrorString(rc), rc);
        free(nv);
        return st;
    }
    *out = nv;
    return DT_OK;
}

/* The GPU's handle, looked up once per bus id. */
static dt_status device_of(dt_nvml *nv, const char *bus_id, int *slot) {
    for (int i = 0; i < nv->n; i++)
        if (strcmp(nv->bus[i], bus_id) == 0) {
            *slot = i;
            return DT_OK;
        }
    if (nv->n == MAX_GPUS) return dt_error_set(DT_ERR_DEVICE, "NVML: more than %d GPUs asked for", MAX_GPUS);
    nvml_device d = NULL;
    nvml_ret rc = nv->nvmlDeviceGetHandleByPciBusId_v2(bus_id, &d);
    if (rc != NVML_SUCCESS)
        return dt_error_set(DT_ERR_DEVICE, "NVML has no GPU at PCI bus id %s: %s (error %d)", bus_id,
                            nv->nvmlErrorString(rc), rc);
    unsigned int index = 0;
    const int i = nv->n++;
    snprintf(nv->bus[i], sizeof nv->bus[i], "%s", bus_id);
    nv->dev[i] = d;
    nv->index[i] = nv->nvmlDeviceGetIndex(d, &index) == NVML_SUCCESS ? (int)index : -1;
    *slot = i;
    return DT_OK;
}

dt_status dt_nvml_sample(dt_nvml *nv, const char *bus_id, dt_gpu_sample *out) {
    int i = 0;
    DT_TRY(device_of(nv, bus_id, &i));
    nvml_utilization u;
    nvml_memory m;
    nvml_ret rc = nv->nvmlDeviceGetMemoryInfo(nv->dev[i], &m);
    if (rc != NVML_SUCCESS)
        return dt_error_set(DT_ERR_DEVICE, "NVML cannot read GPU %d (%s): %s (error %d)", nv->index[i], bus_id,
                            nv->nvmlErrorString(rc), rc);
    unsigned int temp = 0, mw = 0;
    out->index = nv->index[i];
    /* utilisation too may be unsupported (a MIG-partitioned GPU): the memory still counts */
    out->util_pct = nv->nvmlDeviceGetUtilizationRates(nv->dev[i], &u) == NVML_SUCCESS ? (double)u.gpu : NAN;
    out->mem_used_mb = (double)m.used / (1024.0 * 1024.0);
    out->mem_total_mb = (double)m.total / (1024.0 * 1024.0);
    /* not every GPU reports these (NVML_ERROR_NOT_SUPPORTED): no number rather than a wrong one */
    out->temp_c = nv->nvmlDeviceGetTemperature(nv->dev[i], NVML_TEMPERATURE_GPU, &temp) == NVML_SUCCESS ? temp : NAN;
    out->power_w = nv->nvmlDeviceGetPowerUsage(nv->dev[i], &mw) == NVML_SUCCESS ? mw / 1000.0 : NAN;
    return DT_OK;
}

void dt_nvml_close(dt_nvml *nv) {
    if (!nv) return;
    nv->nvmlShutdown();
    free(nv);
}
