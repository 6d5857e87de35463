/* monitor.h — what each worker process is doing, seen from outside: CPU utilisation and
 * memory from /proc, sampled by the launcher every logging.monitor_every_s and published in
 * shared memory, where rank 0 reads them for the console, metrics.jsonl and TensorBoard.
 * (On GPUs the same slots are meant for NVML samples.) */
#ifndef DTRAIN_MONITOR_H
#define DTRAIN_MONITOR_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dtrain/status.h"

typedef struct dt_worker_sample {
    long pid;
    double cpu_pct;      /* CPU time / wall time over the last interval, 100 = one core busy */
    double rss_mb;       /* resident memory now */
    double peak_rss_mb;  /* high-water mark of resident memory */
    uint32_t samples;    /* the sampling round this is from (1, 2, ...; 0: none yet); rounds
                            are published in rank order, so the last rank's round is complete */
} dt_worker_sample;

/* One worker's slot in shared memory: written by the launcher, read by rank 0 (a sequence
 * lock: readers retry while a write is in progress). */
typedef struct dt_worker_slot {
    _Atomic uint32_t seq;
    dt_worker_sample s;
} dt_worker_slot;

void dt_worker_slot_publish(dt_worker_slot *slot, const dt_worker_sample *s);
/* A consistent copy of the slot. */
dt_worker_sample dt_worker_slot_read(const dt_worker_slot *slot);

/* Reads /proc/PID: total CPU time in seconds (user + system, all threads), resident memory
 * and its high-water mark in MB. DT_ERR_IO when the process is gone. */
dt_status dt_proc_read(pid_t pid, double *cpu_s, double *rss_mb, double *peak_rss_mb);

/* Idle check over one round of samples (taken interval_s apart): returns the rank that used
 * less than 10% CPU while every other worker used more than 50% (and writes a sentence
 * naming it into msg), or -1. Ranks without a sample are never called out. */
int dt_monitor_idle_rank(const dt_worker_sample *s, int n, double interval_s, char *msg, size_t msg_size);

#endif
