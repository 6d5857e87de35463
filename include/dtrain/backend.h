/* backend.h — the backend registry: which backends this binary has (cpu always, cuda when it
 * was built with the CUDA toolkit), how many devices each can see, how training.device
 * resolves against them, and opening one (ops.h is the interface of an open backend). It is
 * the one place in src/, besides a backend's own files, that names a backend: a CPU-only
 * build answers "built without CUDA" here, so callers never #ifdef.
 *
 * Nothing here initialises a device library: the launcher calls these before fork. */
#ifndef DTRAIN_BACKEND_H
#define DTRAIN_BACKEND_H

#include <stdio.h>

#include "dtrain/config.h"
#include "dtrain/ops.h"
#include "dtrain/status.h"

/* The table of `kind` (cpu or cuda), or NULL when this binary was built without it. */
const dt_ops *dt_backend_ops(dt_device_kind kind);

/* Devices of `kind` this process may use, found without initialising any library (GPUs: the
 * driver's /proc/driver/nvidia/gpus entries, or where /proc has none the /dev/nvidiaN nodes,
 * limited by CUDA_VISIBLE_DEVICES); 0 when there are none or the kind is not built; the CPU
 * counts as one device. */
int dt_backend_count(dt_device_kind kind);

/* Resolves training.device (auto/cpu/cuda) against what exists: auto is cuda when GPUs are
 * visible and the CUDA backend is built. DT_ERR_CONFIG with a hint when CUDA is asked for and
 * cannot be used, or bf16 is asked for on CPU. */
dt_status dt_backend_resolve(const dt_config *cfg, dt_device_kind *out);

/* For `workers` forked workers of `kind` on this host, one device each: DT_ERR_CONFIG with a
 * hint when there are fewer devices (naming training.num_workers). DT_OK for the CPU. */
dt_status dt_backend_check_workers(const dt_config *cfg, dt_device_kind kind, int workers);

/* For `workers` forked workers of `kind`: when devices would stay unused (8 GPUs visible,
 * training.num_workers 1), a note saying so and how to use them into buf, returning 1; else 0. */
int dt_backend_unused_note(dt_device_kind kind, int workers, char *buf, size_t n);

/* Whether `kind` can run here at all, for commands without a config: DT_ERR_CONFIG
 * "WHO: no GPU is visible (hint: ..., or ALTERNATIVE)" or "WHO: this dtrain was built without
 * the CUDA backend (hint: ALTERNATIVE, ...)". */
dt_status dt_backend_require(dt_device_kind kind, const char *who, const char *alternative);

/* Opens a backend of `kind` in a worker (never before fork). cfg->device is the worker's
 * index among the workers on this host; a launcher that leaves exactly one device visible
 * per process (srun --gpus-per-task, one-GPU pods) gets that one, whatever the index.
 * DT_ERR_CONFIG naming the build for a kind this binary lacks. dt_backend_close accepts NULL. */
dt_status dt_backend_open(dt_device_kind kind, const dt_backend_cfg *cfg, dt_backend **out);
void dt_backend_close(dt_backend *be);

/* For --version: each backend's libraries (found at run time next to the ones this binary was
 * built with, mismatches marked), "not built" for the others, then the devices visible.
 * Returns the number of mismatches. */
int dt_backend_print_versions(FILE *out);
/* For doctor: "  NVIDIA GPUs visible: N (CUDA backend built|not built)". */
void dt_backend_print_devices(FILE *out);

#endif
