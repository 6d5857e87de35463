/* cuda.h — the CUDA backend (built when nvcc, cuBLAS, cuDNN and NCCL are found).
 *
 * For now it holds what the rest of the program needs before GPU training lands: library
 * versions and a probe that runs one kernel. None of these is called before fork. */
#ifndef DTRAIN_CUDA_H
#define DTRAIN_CUDA_H

#include <stddef.h>

#include "dtrain/status.h"

/* One line each for CUDA (runtime, driver), cuBLASLt, cuDNN and NCCL: the version found at
 * run time next to the one dtrain was built with, marked "MISMATCH: why" where they do not
 * go together. Queries that create no context. Returns the number of mismatches. */
int dt_cuda_versions(char *buf, size_t n);

/* Runs a one-block kernel on `device` that writes 42 into a device int, copies it back and
 * checks it. DT_ERR_DEVICE with the failing call, file:line when anything fails. */
dt_status dt_cuda_probe(int device);

#endif
