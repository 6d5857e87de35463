/* device.h — what hardware this process may use, decided without initialising CUDA
 * (the launcher forks workers afterwards; a CUDA context must never exist before fork). */
#ifndef DTRAIN_DEVICE_H
#define DTRAIN_DEVICE_H

#include <stdio.h>

#include "dtrain/config.h"
#include "dtrain/status.h"

/* CPUs this process may run on (sched_getaffinity), >= 1. */
int dt_device_cpu_cores(void);

/* NVIDIA GPUs visible to this process: the driver's /proc/driver/nvidia/gpus entries (or,
 * where /proc has none, the /dev/nvidiaN nodes), limited by CUDA_VISIBLE_DEVICES when set.
 * 0 when there is no driver. No CUDA call. */
int dt_device_cuda_count(void);

/* 1 when this binary was built with the CUDA backend. */
int dt_device_cuda_built(void);

/* Resolves training.device (auto/cpu/cuda) against what exists: auto is cuda when GPUs are
 * visible and the CUDA backend is built. DT_ERR_CONFIG with a hint when CUDA is asked for and
 * cannot be used, or bf16 is asked for on CPU. Makes no CUDA call (safe before fork). */
dt_status dt_device_resolve(const dt_config *cfg, dt_device_kind *out);
/* For forked GPU workers (one per GPU on this host): DT_ERR_CONFIG with a hint when
 * training.num_workers exceeds the visible GPUs. No CUDA call. */
dt_status dt_device_check_gpus_for_workers(const dt_config *cfg);

/* BLAS/OpenMP threads per worker: training.cpu_threads_per_worker, or cores / num_workers. */
int dt_device_threads_per_worker(const dt_config *cfg);

/* When OpenBLAS runs its generic kernels on a CPU that has AVX2 or AVX-512 (it did not
 * recognise the CPU, as happens in some VMs), writes a one-line hint naming the
 * OPENBLAS_CORETYPE to try and returns 1; else returns 0. */
int dt_device_blas_advice(char *buf, size_t n);

/* For --version: each library's version found at run time next to the one this binary was
 * built with (libyaml, zlib, jansson, OpenBLAS; CUDA, cuBLASLt, cuDNN, NCCL when the CUDA
 * backend is built), mismatches marked. Returns the number of mismatches. */
int dt_device_print_versions(FILE *out);
/* The closing line: all match, or how many do not and what to do. */
void dt_device_print_version_verdict(FILE *out, int mismatches);

#endif
