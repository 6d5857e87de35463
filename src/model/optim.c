/* optim.c — AdamW, LR schedules and global-norm clipping over the op table. */
#include "dtrain/optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


struct dt_optim {
    dt_optim_cfg cfg;
    const dt_backend *be;
    size_t n_params;
    dt_range *own;     /* the ranges this optimizer updates (all: one) */
    size_t *own_moff;  /* (n_own) where each starts in m and v */
    int n_own;
    dt_range *counted; /* the gradient norm's ranges (dt_optim_count_norm): own when NULL */
    int n_counted;
    dt_adamw_piece *pieces; /* the segments cut by the ranges, in order: one adamw call */
    int n_pieces;
    size_t n_moments;  /* floats of m and of v: the ranges' total */
    float *m, *v;      /* backend (n_moments) */
    double *sumsq_dev; /* backend: the queued sum of squares (dt_optim_norm) */
    double *sumsq_host;/* backend host memory (alloc_host): its copy, after the next check */
};

void dt_optim_free(dt_optim *o) {
    if (!o) return;
    o->be->ops->free(o->be->ctx, o->m);
    o->be->ops->free(o->be->ctx, o->v);
    o->be->ops->free(o->be->ctx, o->sumsq_dev);
    o->be->ops->free_host(o->be->ctx, o->sumsq_host);
    free(o->own);
    free(o->own_moff);
    free(o->counted);
    free(o->pieces);
    free(o);
}

dt_status dt_optim_init_shard(dt_optim **out, const dt_optim_cfg *cfg, const dt_backend *be, size_t n_params,
                              const dt_param_seg *segs, int n_segs, const dt_range *own, int n_own) {
    *out = NULL;
    for (int i = 0; i < n_own; i++)
        if (own[i].offset + own[i].numel > n_params || (i > 0 && own[i].offset < own[i - 1].offset + own[i - 1].numel))
            return dt_error_set(DT_ERR_INTERNAL, "optimizer: shard range %d [%zu, +%zu) is out of order or outside "
                                "the %zu parameters", i, own[i].offset, own[i].numel, n_params);
    dt_optim *o = dt_calloc(1, sizeof *o, "optimizer");
    if (!o) return DT_ERR_NOMEM;
    o->cfg = *cfg;
    o->be = be;
    o->n_params = n_params;
    o->n_own = n_own;
    dt_status st = DT_ERR_NOMEM;
    o->own = dt_malloc((size_t)(n_own ? n_own : 1) * sizeof *o->own, "optimizer ranges");
    o->own_moff = dt_malloc((size_t)(n_own ? n_own : 1) * sizeof *o->own_moff, "optimizer ranges");
    o->pieces = dt_malloc((size_t)(n_segs + n_own + 1) * sizeof *o->pieces, "optimizer segments");
    if (!o->own || !o->own_moff || !o->pieces) goto fail;
    memcpy(o->own, own, (size_t)n_own * sizeof *own);
    /* cut the segments by the ranges: both are in increasing order */
    for (int i = 0, s = 0; i < n_own; i++) {
        const size_t lo = own[i].offset, hi = lo + own[i].numel;
        o->own_moff[i] = o->n_moments;
        while (s < n_segs && segs[s].offset + segs[s].numel <= lo) s++;
        for (int k = s; k < n_segs && segs[k].offset < hi; k++) {
            size_t a = segs[k].offset > lo ? segs[k].offset : lo;
            size_t b = segs[k].offset + segs[k].numel < hi ? segs[k].offset + segs[k].numel : hi;
            if (b <= a) continue;
            if (o->n_pieces == n_segs + n_own + 1) { /* more pieces than a cut can make: overlapping segments */
                st = dt_error_set(DT_ERR_INTERNAL, "optimizer: the parameter segments overlap");
                goto fail;
            }
            o->pieces[o->n_pieces++] = (dt_adamw_piece){a, o->n_moments + (a - lo), b - a, segs[k].decay};
        }
        o->n_moments += own[i].numel;
    }
    if ((st = be->ops->alloc(be->ctx, o->n_moments * sizeof(float), "AdamW first moments", (void **)&o->m)) != DT_OK)
        goto fail;
    if ((st = be->ops->alloc(be->ctx, o->n_moments * sizeof(float), "AdamW second moments", (void **)&o->v)) != DT_OK)
        goto fail;
    if ((st = be->ops->alloc(be->ctx, sizeof(double), "the gradient norm", (void **)&o->sumsq_dev)) != DT_OK ||
        (st = be->ops->alloc_host(be->ctx, sizeof(double), "the gradient norm", (void **)&o->sumsq_host)) != DT_OK)
        goto fail;
    *out = o;
    return DT_OK;
fail:
    dt_optim_free(o);
    return st;
}

dt_status dt_optim_init(dt_optim **out, const dt_optim_cfg *cfg, const dt_backend *be, size_t n_params,
                        const dt_param_seg *segs, int n_segs) {
    const dt_range all = {0, n_params};
    return dt_optim_init_shard(out, cfg, be, n_params, segs, n_segs, &all, 1);
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

dt_status dt_optim_count_norm(dt_optim *o, const dt_range *ranges, int n) {
    free(o->counted);
    o->n_counted = 0;
    if (!(o->counted = dt_malloc((size_t)(n ? n : 1) * sizeof *ranges, "gradient norm ranges"))) return DT_ERR_NOMEM;
    memcpy(o->counted, ranges, (size_t)n * sizeof *ranges);
    o->n_counted = n;
    return DT_OK;
}

void dt_optim_norm(dt_optim *o, const float *grads) {
    const dt_ops *ops = o->be->ops;
    /* one call over every range the norm counts */
    ops->sumsq(o->be->ctx, o->sumsq_dev, grads, o->counted ? o->counted : o->own, o->counted ? o->n_counted : o->n_own);
    ops->download_async(o->be->ctx, o->sumsq_host, o->sumsq_dev, sizeof(double));
}

double dt_optim_norm_sumsq(const dt_optim *o) { return *o->sumsq_host; }

dt_status dt_optim_sumsq(dt_optim *o, const float *grads, double *out) {
    dt_optim_norm(o, grads);
    dt_status st = o->be->ops->check(o->be->ctx); /* a device fault anywhere in forward/backward surfaces here */
    *out = dt_optim_norm_sumsq(o);
    return st;
}

dt_status dt_optim_update(dt_optim *o, float *params, float *grads, long step, double sumsq, double *grad_norm,
                          double *lr_out) {
    const dt_ops *ops = o->be->ops;
    void *ctx = o->be->ctx;
    double norm = sqrt(sumsq);
    *grad_norm = norm;
    double lr = dt_optim_lr(&o->cfg, step);
    *lr_out = lr;
    if (!isfinite(norm))
        return dt_error_set(DT_ERR_INTERNAL,
                            "step %ld: gradient norm is %g; the update was skipped (hint: lower optimizer.lr or set "
                            "optimizer.grad_clip)", step + 1, norm);
    if (o->cfg.grad_clip > 0 && norm > o->cfg.grad_clip) /* one call over every owned range */
        ops->scale(ctx, grads, o->own, o->n_own, (float)(o->cfg.grad_clip / (norm + 1e-6)));
    ops->adamw(ctx, params, grads, o->m, o->v, o->pieces, o->n_pieces, (float)lr, (float)o->cfg.beta1,
               (float)o->cfg.beta2, (float)o->cfg.eps, (float)o->cfg.weight_decay, (int)(step + 1));
    return DT_OK;
}

dt_status dt_optim_step(dt_optim *o, float *params, float *grads, long step, double *grad_norm, double *lr) {
    double sumsq;
    DT_TRY(dt_optim_sumsq(o, grads, &sumsq));
    return dt_optim_update(o, params, grads, step, sumsq, grad_norm, lr);
}

float *dt_optim_m(dt_optim *o) { return o->m; }
float *dt_optim_v(dt_optim *o) { return o->v; }

size_t dt_optim_num_params(const dt_optim *o) { return o->n_params; }
size_t dt_optim_moment_floats(const dt_optim *o) { return o->n_moments; }

/* the part of own range i inside [offset, offset + n): *lo, *hi in the layout; 0 if none */
static int own_part(const dt_optim *o, int i, size_t offset, size_t n, size_t *lo, size_t *hi) {
    const size_t a = o->own[i].offset, b = a + o->own[i].numel;
    *lo = a > offset ? a : offset;
    *hi = b < offset + n ? b : offset + n;
    return *lo < *hi;
}

void dt_optim_get_range(const dt_optim *o, int which, size_t offset, size_t n, float *host) {
    const float *mom = which ? o->v : o->m;
    size_t lo, hi;
    for (int i = 0; i < o->n_own; i++)
        if (own_part(o, i, offset, n, &lo, &hi))
            o->be->ops->download(o->be->ctx, host + (lo - offset), mom + o->own_moff[i] + (lo - o->own[i].offset),
                                 (hi - lo) * sizeof(float));
}

void dt_optim_set_range(dt_optim *o, int which, size_t offset, size_t n, const float *host) {
    float *mom = which ? o->v : o->m;
    size_t lo, hi;
    for (int i = 0; i < o->n_own; i++)
        if (own_part(o, i, offset, n, &lo, &hi))
            o->be->ops->upload(o->be->ctx, mom + o->own_moff[i] + (lo - o->own[i].offset), host + (lo - offset),
                               (hi - lo) * sizeof(float));
}

dt_status dt_optim_get_moments(const dt_optim *o, float *m_host, float *v_host) {
    dt_optim_get_range(o, 0, 0, o->n_params, m_host);
    dt_optim_get_range(o, 1, 0, o->n_params, v_host);
    return o->be->ops->check(o->be->ctx);
}

void dt_optim_set_moments(dt_optim *o, const float *m_host, const float *v_host) {
    dt_optim_set_range(o, 0, 0, o->n_params, m_host);
    dt_optim_set_range(o, 1, 0, o->n_params, v_host);
}

void dt_optim_place_moments(const dt_optim *o, int which, float *full) {
    const float *src = which ? o->v : o->m;
    for (int i = 0; i < o->n_own; i++)
        o->be->ops->copy(o->be->ctx, full + o->own[i].offset, src + o->own_moff[i], o->own[i].numel * sizeof(float));
}
