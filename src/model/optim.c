/* optim.c — AdamW, LR schedules and global-norm clipping over the op table. */
#include "dtrain/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dt_optim {
    dt_optim_cfg cfg;
    const dt_backend *be;
    size_t n_params;
    dt_param_seg *segs;
    int n_segs;
    float *m, *v; /* backend (n_params) */
};

void dt_optim_free(dt_optim *o) {
    if (!o) return;
    o->be->ops->free(o->be->ctx, o->m);
    o->be->ops->free(o->be->ctx, o->v);
    free(o->segs);
    free(o);
}

dt_status dt_optim_init(dt_optim **out, const dt_optim_cfg *cfg, const dt_backend *be, size_t n_params,
                        const dt_param_seg *segs, int n_segs) {
    *out = NULL;
    dt_optim *o = dt_calloc(1, sizeof *o, "optimizer");
    if (!o) return DT_ERR_NOMEM;
    o->cfg = *cfg;
    o->be = be;
    o->n_params = n_params;
    o->n_segs = n_segs;
    dt_status st = DT_ERR_NOMEM;
    o->segs = dt_malloc((size_t)n_segs * sizeof *segs, "optimizer segments");
    if (!o->segs) goto fail;
    memcpy(o->segs, segs, (size_t)n_segs * sizeof *segs);
    if ((st = be->ops->alloc(be->ctx, n_params * sizeof(float), "AdamW first moments", (void **)&o->m)) != DT_OK) goto fail;
    if ((st = be->ops->alloc(be->ctx, n_params * sizeof(float), "AdamW second moments", (void **)&o->v)) != DT_OK) goto fail;
    *out = o;
    return DT_OK;
fail:
    dt_optim_free(o);
    return st;
}

double dt_optim_lr(const dt_optim_cfg *c, long step) {
    if (c->warmup_steps > 0 && step < c->warmup_steps) return c->lr * (double)(step + 1) / (double)c->warmup_steps;
    if (c->schedule == DT_SCHED_CONSTANT) return c->lr;
    long decay_steps = c->total_steps - c->warmup_steps;
    double frac = decay_steps > 0 ? (double)(step - c->warmup_steps) / (double)decay_steps : 1.0;
    if (frac > 1.0) frac = 1.0;
    if (frac < 0.0) frac = 0.0;
    double min_lr = c->lr * c->min_lr_ratio;
    double coeff = c->schedule == DT_SCHED_COSINE ? 0.5 * (1.0 + cos(M_PI * frac)) : 1.0 - frac;
    return min_lr + coeff * (c->lr - min_lr);
}

dt_status dt_optim_step(dt_optim *o, float *params, float *grads, long step, double *grad_norm, double *lr_out) {
    const dt_ops *ops = o->be->ops;
    void *ctx = o->be->ctx;
    double norm = sqrt(ops->sumsq(ctx, grads, o->n_params));
    DT_TRY(ops->check(ctx)); /* a device fault anywhere in forward/backward surfaces here */
    *grad_norm = norm;
    double lr = dt_optim_lr(&o->cfg, step);
    *lr_out = lr;
    if (!isfinite(norm))
        return dt_error_set(DT_ERR_INTERNAL,
                            "step %ld: gradient norm is %g; the update was skipped (hint: lower optimizer.lr or set "
                            "optimizer.grad_clip)", step + 1, norm);
    if (o->cfg.grad_clip > 0 && norm > o->cfg.grad_clip)
        ops->scale(ctx, grads, o->n_params, (float)(o->cfg.grad_clip / (norm + 1e-6)));
    int t = (int)(step + 1);
    for (int i = 0; i < o->n_segs; i++) {
        const dt_param_seg *s = &o->segs[i];
        ops->adamw(ctx, params + s->offset, grads + s->offset, o->m + s->offset, o->v + s->offset, s->numel,
                   (float)lr, (float)o->cfg.beta1, (float)o->cfg.beta2, (float)o->cfg.eps,
                   s->decay ? (float)o->cfg.weight_decay : 0.0f, t);
    }
    return DT_OK;
}

float *dt_optim_m(dt_optim *o) { return o->m; }
float *dt_optim_v(dt_optim *o) { return o->v; }

size_t dt_optim_num_params(const dt_optim *o) { return o->n_params; }

dt_status dt_optim_get_moments(const dt_optim *o, float *m_host, float *v_host) {
    o->be->ops->download(o->be->ctx, m_host, o->m, o->n_params * sizeof(float));
    o->be->ops->download(o->be->ctx, v_host, o->v, o->n_params * sizeof(float));
    return o->be->ops->check(o->be->ctx);
}

void dt_optim_set_moments(dt_optim *o, const float *m_host, const float *v_host) {
    o->be->ops->upload(o->be->ctx, o->m, m_host, o->n_params * sizeof(float));
    o->be->ops->upload(o->be->ctx, o->v, v_host, o->n_params * sizeof(float));
}
