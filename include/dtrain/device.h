/* device.h — the host this process runs on: CPU cores, the thread budget per worker, OpenBLAS
 * advice and the host libraries' versions. Accelerators are the backends' (backend.h). */
#ifndef DTRAIN_DEVICE_H
#define DTRAIN_DEVICE_H

#include <stdio.h>

#include "dtrain/config.h"
#include "dtrain/status.h"

/* CPUs this process may run on (sched_getaffinity), >= 1. */
int dt_device_cpu_cores(void);

/* BLAS/OpenMP threads per worker: training.cpu_threads_per_worker, or cores / num_workers. */
int dt_device_threads_per_worker(const dt_config *cfg);

/* CPU time spent so far on the CPUs this process may run on (/proc/stat, the per-CPU lines of
 * the affinity set): *busy_s (user, nice, system, irq, softirq, steal) and *total_s (busy plus
 * idle and iowait), in seconds. The difference of two readings over a wall interval gives how
 * many of those cores were busy meanwhile, whoever used them. DT_ERR_IO when unreadable. */
dt_status dt_device_cpu_time(double *busy_s, double *total_s);
/* Cores busy over the next `window_s` seconds (sleeps that long): 0 .. dt_device_cpu_cores();
 * -1 when /proc/stat cannot be read. */
double dt_device_busy_cores(double window_s);

/* When OpenBLAS runs its generic kernels on a CPU that has AVX2 or AVX-512 (it did not
 * recognise the CPU, as happens in some VMs), writes a one-line hint naming the
 * OPENBLAS_CORETYPE to try and returns 1; else returns 0. */
int dt_device_blas_advice(char *buf, size_t n);

/* For --version: each host library's version found at run time next to the one this binary
 * was built with (libyaml, zlib, jansson, OpenBLAS), mismatches marked. Returns the number of
 * mismatches. (dt_backend_print_versions prints the backends' libraries.) */
int dt_device_print_versions(FILE *out);
/* The closing line: all match, or how many do not and what to do. */
void dt_device_print_version_verdict(FILE *out, int mismatches);

#endif
