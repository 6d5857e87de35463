/* cuda.h — the CUDA backend (built when nvcc, cuBLAS, cuDNN and NCCL are found).
 *
 * For now it holds what the rest of the program needs before GPU training lands: library
 * versions and a probe that runs one kernel. None of these is called before fork. */
#ifndef DTRAIN_CUDA_H
#define DTRAIN_CUDA_H

#include <stddef.h>

#include "dtrain/status.h"

/* "CUDA runtime 13.0 (driver 13.0), cuBLASLt 13.x, cuDNN 9.x, NCCL 2.x": queries that do not
 * create a context. Never fails; unknown parts read "?". */
void dt_cuda_versions(char *buf, size_t n);

/* Runs a one-block kernel on `device` that writes 42 into a device int, copies it back and
 * checks it. DT_ERR_DEVICE with the failing call, file:line when anything fails. */
dt_status dt_cuda_probe(int device);

#endif
