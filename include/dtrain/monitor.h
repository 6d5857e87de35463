/* monitor.h — what each worker process is doing, seen from outside: CPU utilisation and
 * memory from /proc, and for a GPU worker its GPU's utilisation, memory, temperature and power
 * from NVML (nvml.h), sampled by the launcher every logging.monitor_every_s and published in
 * shared memory, where rank 0 reads them for the console, metrics.jsonl and TensorBoard. */
#ifndef DTRAIN_MONITOR_H
#define DTRAIN_MONITOR_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dtrain/status.h"

typedef struct dt_gpu_sample {
    int index;            /* NVML's index of the GPU (nvidia-smi's), -1 when unknown */
    double util_pct;      /* share of the last sample period (1/6 to 1 s) a kernel was running; NaN:
                             not reported (MIG) */
    double mem_used_mb;   /* device memory in use (all processes), MiB */
    double mem_total_mb;  /* MiB */
    double temp_c;        /* GPU core temperature; NaN when the GPU does not report it */
    double power_w;       /* power draw; NaN when the GPU does not report it */
} dt_gpu_sample;

typedef struct dt_worker_sample {
    long pid;
    double cpu_pct;      /* CPU time / wall time over the last interval, 100 = one core busy */
    double rss_mb;       /* resident memory now */
    double peak_rss_mb;  /* high-water mark of resident memory */
    uint32_t samples;    /* the sampling round this is from (1, 2, ...; 0: none yet); rounds
                            are published in rank order, so the last rank's round is complete */
    int has_gpu;         /* 1: `gpu` is a sample of this worker's GPU (0: a CPU worker, no NVML) */
    dt_gpu_sample gpu;
    double gpu_peak_mem_mb; /* the most device memory in use at any of its samples */
} dt_worker_sample;

/* One worker's slot in shared memory: written by the launcher, read by rank 0 (a sequence
 * lock: readers retry while a write is in progress). */
typedef struct dt_worker_slot {
    _Atomic uint32_t seq;
    dt_worker_sample s;
    /* written once by the worker when its backend has a device: the GPU's PCI bus id */
    _Atomic uint32_t gpu_set;
    char gpu_bus_id[32];
} dt_worker_slot;

void dt_worker_slot_publish(dt_worker_slot *slot, const dt_worker_sample *s);
/* A consistent copy of the slot. */
dt_worker_sample dt_worker_slot_read(const dt_worker_slot *slot);
/* The worker says which GPU it drives (its PCI bus id); the launcher asks: 1 and the id in
 * buf when the worker has said it, else 0. */
void dt_worker_slot_set_gpu(dt_worker_slot *slot, const char *bus_id);
int dt_worker_slot_gpu(const dt_worker_slot *slot, char *buf, size_t n);

/* Reads /proc/PID: total CPU time in seconds (user + system, all threads), resident memory
 * and its high-water mark in MB. DT_ERR_IO when the process is gone. */
dt_status dt_proc_read(pid_t pid, double *cpu_s, double *rss_mb, double *peak_rss_mb);
/* The process state letter of /proc/PID/stat (R, S, D, T stopped, t traced, Z, ...); 0 when it
 * cannot be read. */
char dt_proc_state(pid_t pid);

/* Idle check over one round of samples (taken interval_s apart): returns the rank that used
 * less than 10% CPU while every other worker used more than 50% (and writes a sentence
 * naming it into msg), or -1. Ranks without a sample are never called out. */
int dt_monitor_idle_rank(const dt_worker_sample *s, int n, double interval_s, char *msg, size_t msg_size);
/* The same over the GPUs: the rank whose GPU was busy less than 10% of the time while every
 * other worker's GPU was busy more than 50% (msg names rank, GPU index and bus id), or -1.
 * Ranks without a GPU sample are never called out, and with one a GPU is never idle "while
 * the others work" unless every other rank has a GPU sample. */
int dt_monitor_idle_gpu(const dt_worker_sample *s, const char (*bus_id)[32], int n, double interval_s, char *msg,
                        size_t msg_size);

#endif
