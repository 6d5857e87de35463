/* doctor.h — `dtrain doctor`: what this machine offers (cores, GPUs, libraries) and whether
 * the collective works here: a self-test with N real worker processes (all-reduce of
 * per-rank data checked against a serial sum, broadcast, all-gather, barrier) and an
 * all-reduce bandwidth table from 1 KiB to 256 MiB with algbw and busbw as nccl-tests
 * defines them (busbw = algbw * 2(n-1)/n), next to this machine's memcpy bandwidth.
 * With --device cuda: worker r runs a kernel on GPU r, then the same self-test and table over
 * NCCL (the table on device buffers). With --tensor-parallel T (CPU): also every model-parallel
 * group's collective, as training lays the workers out (comm_plan.h dt_mesh). */
#ifndef DTRAIN_DOCTOR_H
#define DTRAIN_DOCTOR_H

#include <stdio.h>

#include "dtrain/config.h"
#include "dtrain/status.h"

typedef struct dt_doctor_opts {
    int num_workers;          /* 0: 2 on CPU, one per visible GPU with cuda */
    dt_device_kind device;    /* cpu or cuda (auto: what exists) */
    double timeout_s;         /* collective deadline */
    long max_bytes;           /* largest all-reduce in the table (default 256 MiB) */
    int tensor_parallel;      /* > 1: the workers also laid out as training.tensor_parallel lays them out: the
                                 self-test over every tensor-parallel and data-parallel group's collective, and
                                 rank 0's groups' all-reduce tables (CPU only) */
    int pipeline_parallel;    /* > 1: and as training.pipeline_parallel lays them out: every pair of neighbouring
                                 stages' sends and exchange, and rank 0's pair's send table (CPU only) */
} dt_doctor_opts;

/* The libraries this binary uses and their versions, then a verdict line (what `dtrain
 * --version` prints after its first line, and `dtrain doctor` in its report). */
void dt_doctor_print_versions(FILE *out);

/* Prints the report on stdout. DT_OK when the self-test passed; DT_ERR_INTERNAL (exit 1)
 * with the failing check named when it did not; DT_ERR_CONFIG for a device that is absent. */
dt_status dt_doctor_run(const dt_doctor_opts *opts);

#endif
