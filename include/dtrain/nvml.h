/* nvml.h — the GPUs as the driver sees them: utilisation, memory, temperature and power of a
 * GPU named by its PCI bus id, through NVML (libnvidia-ml.so.1, part of the NVIDIA driver),
 * opened at run time with dlopen like the other NVIDIA libraries: a build without the CUDA
 * toolkit has it too, and a machine without the driver only lacks the samples. The launcher
 * samples each GPU worker's GPU with it (src/run/launch.c). */
#ifndef DTRAIN_NVML_H
#define DTRAIN_NVML_H

#include <stddef.h>

#include "dtrain/monitor.h" /* dt_gpu_sample */
#include "dtrain/status.h"

typedef struct dt_nvml dt_nvml;

/* Opens NVML (`lib`: a path or soname; NULL: "libnvidia-ml.so.1") and initialises it.
 * DT_ERR_DEVICE with a message naming the library and why when it cannot. */
dt_status dt_nvml_open(const char *lib, dt_nvml **out);
/* One sample of the GPU whose PCI bus id is `bus_id` ("00000000:3B:00.0", as nvidia-smi and
 * dt_backend_desc.bus_id write it); a measure the GPU does not report is NaN. DT_ERR_DEVICE
 * naming the GPU when NVML has no such GPU or cannot read its memory. */
dt_status dt_nvml_sample(dt_nvml *nv, const char *bus_id, dt_gpu_sample *out);
/* Shuts NVML down (the library stays loaded). NULL is fine. */
void dt_nvml_close(dt_nvml *nv);

#endif
