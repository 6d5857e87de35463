/* optim.h — AdamW (as torch.optim.AdamW), learning-rate schedule and global-norm clipping.
 *
 * The optimizer owns its moment buffers (backend memory, one flat buffer each, same layout
 * as the parameters) and updates parameters segment by segment, with weight decay only on
 * segments marked `decay` (tensors with >= 2 dims, DESIGN.md §4). */
#ifndef DTRAIN_OPTIM_H
#define DTRAIN_OPTIM_H

#include <stddef.h>

#include "dtrain/config.h"
#include "dtrain/ops.h"
#include "dtrain/status.h"

typedef struct dt_optim dt_optim;

typedef struct dt_optim_cfg {
    double lr, weight_decay, beta1, beta2, eps;
    double grad_clip;       /* 0 = no clipping */
    dt_schedule schedule;
    long warmup_steps;
    long total_steps;       /* for the decay schedules */
    double min_lr_ratio;
} dt_optim_cfg;

typedef struct dt_param_seg {
    size_t offset, numel;   /* floats */
    int decay;              /* apply weight decay */
} dt_param_seg;

/* Copies `segs`; the moments live in `be`, which must outlive the optimizer. dt_optim_free
 * accepts NULL. */
dt_status dt_optim_init(dt_optim **out, const dt_optim_cfg *cfg, const dt_backend *be, size_t n_params,
                        const dt_param_seg *segs, int n_segs);
void dt_optim_free(dt_optim *o);

/* The optimizer of one shard (ZeRO-1): moments only for `own` (n_own ranges in increasing
 * order, disjoint, within n_params; copied), and every call below touches only those ranges
 * of params and grads. dt_optim_init is this with one range over everything. */
dt_status dt_optim_init_shard(dt_optim **out, const dt_optim_cfg *cfg, const dt_backend *be, size_t n_params,
                              const dt_param_seg *segs, int n_segs, const dt_range *own, int n_own);

/* Learning rate for 0-based optimizer step `step`: linear warmup lr*(step+1)/warmup over
 * warmup_steps, then constant, or cosine/linear decay from lr to lr*min_lr_ratio at
 * total_steps. */
double dt_optim_lr(const dt_optim_cfg *cfg, long step);

/* One update at 0-based `step`: computes the global grad norm (returned in *grad_norm, before
 * clipping), clips as torch.nn.utils.clip_grad_norm_ (grads *= clip/(norm+1e-6) when
 * norm > clip), then AdamW with t = step + 1. *lr receives the rate used. A non-finite grad
 * norm skips the update and returns DT_ERR_INTERNAL with a message. */
dt_status dt_optim_step(dt_optim *o, float *params, float *grads, long step, double *grad_norm, double *lr);
/* dt_optim_step in two halves, for a shard: the sum of squares of its own gradients (*out),
 * with the device's failure, if any; then, given the sum over all shards, the update. */
dt_status dt_optim_sumsq(dt_optim *o, const float *grads, double *out);
/* dt_optim_sumsq without the wait, for a training step that waits for the device once: queues
 * the sum of squares of its own gradients (one sumsq over its ranges) and its copy to the host;
 * dt_optim_norm_sumsq returns it once the backend's next check has returned DT_OK. */
void dt_optim_norm(dt_optim *o, const float *grads);
/* Model parallelism: the sum of squares above (and dt_optim_sumsq's) over `ranges` (n, in
 * increasing order; copied) instead of the optimizer's own ranges: the gradients this rank's part
 * of the whole model's norm counts (a tensor every share holds whole counts on one share). */
dt_status dt_optim_count_norm(dt_optim *o, const dt_range *ranges, int n);
double dt_optim_norm_sumsq(const dt_optim *o);
dt_status dt_optim_update(dt_optim *o, float *params, float *grads, long step, double sumsq, double *grad_norm,
                          double *lr);

/* Moment buffers (backend memory, dt_optim_moment_floats each: a shard's ranges one after
 * the other), for checkpoints. */
float *dt_optim_m(dt_optim *o);
float *dt_optim_v(dt_optim *o);
size_t dt_optim_moment_floats(const dt_optim *o);
/* Host copies of the moments, for checkpoints, in the parameters' layout (n_params floats
 * each): get copies the optimizer's ranges into m_host/v_host (a shard leaves the rest
 * alone); set copies them from there. */
size_t dt_optim_num_params(const dt_optim *o);
dt_status dt_optim_get_moments(const dt_optim *o, float *m_host, float *v_host); /* the device's failure, if any */
void dt_optim_set_moments(dt_optim *o, const float *m_host, const float *v_host);
/* The same for elements [offset, offset + n) of the layout and one moment (which 0: first, 1:
 * second): host holds those n; a checkpoint moves them a part at a time. */
void dt_optim_get_range(const dt_optim *o, int which, size_t offset, size_t n, float *host);
void dt_optim_set_range(dt_optim *o, int which, size_t offset, size_t n, const float *host);
/* A shard's moments (which 0: first, 1: second) copied into its ranges of full(n_params),
 * backend memory, the rest untouched: what an all-gather of parts then makes whole. */
void dt_optim_place_moments(const dt_optim *o, int which, float *full);

#endif
