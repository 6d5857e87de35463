/* cuda.h — the CUDA backend (built when nvcc, cuBLAS, cuDNN and NCCL are found): the GPU op
 * table, library versions and a probe that runs one kernel. None of these is called before
 * fork: the launcher never initialises CUDA. */
#ifndef DTRAIN_CUDA_H
#define DTRAIN_CUDA_H

#include <stddef.h>

#include "dtrain/model.h"
#include "dtrain/ops.h"
#include "dtrain/status.h"

/* One line each for CUDA (runtime, driver), cuBLASLt, cuDNN and NCCL: the version found at
 * run time next to the one dtrain was built with, marked "MISMATCH: why" where they do not
 * go together. Queries that create no context. Returns the number of mismatches. */
int dt_cuda_versions(char *buf, size_t n);

/* Runs a one-block kernel on `device` that writes 42 into a device int, copies it back and
 * checks it. DT_ERR_DEVICE with the failing call, file:line when anything fails. */
dt_status dt_cuda_probe(int device);

/* The op table of ops.h on GPU `device` (an index among the visible GPUs), for worker `rank`
 * (named in messages). precision 1 (bf16): product inputs rounded to bf16 (fp32 accumulation
 * and outputs); 0: fp32 throughout; -1 (auto): bf16 where the GPU has bf16 tensor cores
 * (compute capability >= 8.0), else fp32. dt_ops_cuda_bf16 says which was chosen. Loads cuBLASLt. A device that is not there, or has no bf16 support
 * when asked for it, is DT_ERR_CONFIG with a hint. dt_ops_cuda_free accepts NULL. */
dt_status dt_ops_cuda_init(dt_ops **out, int device, int precision, int rank);
int dt_ops_cuda_bf16(const dt_ops *ops);
void dt_ops_cuda_free(dt_ops *ops);
/* The cudaStream_t every op of `ops` runs on (collectives order themselves after it). */
void *dt_ops_cuda_stream(const dt_ops *ops);
/* "GPU 0 (NVIDIA H200, 139.81 GiB) on host" */
void dt_ops_cuda_describe(const dt_ops *ops, char *buf, size_t n);
/* Device memory the backend adds to dt_model_memory_bytes for this shape: scratch for the
 * attention products and bf16 copies, and the cuBLASLt workspace (an estimate, for the
 * start-up line). */
size_t dt_ops_cuda_scratch_bytes(const dt_model_cfg *model, int bf16);
/* Grows the backend's scratch to what training `model` needs, so that running out of memory
 * happens here, at start, naming the buffer, and no scratch is reallocated mid-step. */
dt_status dt_ops_cuda_reserve(dt_ops *ops, const dt_model_cfg *model);

#endif
