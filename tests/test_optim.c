/* test_optim.c — LR schedules, global-norm clipping and AdamW through dt_optim against a
 * double-precision reference of torch.optim.AdamW / clip_grad_norm_. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "dtrain/backend.h"
#include "dtrain/optim.h"

static void test_schedules(void) {
    dt_optim_cfg c = {.lr = 1e-3, .schedule = DT_SCHED_COSINE, .warmup_steps = 10, .total_steps = 110,
                      .min_lr_ratio = 0.1};
    CHECK_NEAR_REL(dt_optim_lr(&c, 0), 1e-4, 1e-12, 0);      /* warmup: lr * 1/10 */
    CHECK_NEAR_REL(dt_optim_lr(&c, 9), 1e-3, 1e-12, 0);      /* end of warmup */
    CHECK_NEAR_REL(dt_optim_lr(&c, 10), 1e-3, 1e-12, 0);     /* decay starts at full lr */
    CHECK_NEAR_REL(dt_optim_lr(&c, 60), 0.55e-3, 1e-12, 0);  /* cosine midpoint: (1 + 0.1)/2 */
    CHECK_NEAR_REL(dt_optim_lr(&c, 110), 1e-4, 1e-12, 0);    /* min_lr at the end */
    CHECK_NEAR_REL(dt_optim_lr(&c, 500), 1e-4, 1e-12, 0);    /* stays there */
    c.schedule = DT_SCHED_LINEAR;
    CHECK_NEAR_REL(dt_optim_lr(&c, 60), 0.55e-3, 1e-12, 0);
    CHECK_NEAR_REL(dt_optim_lr(&c, 35), 1e-3 - 0.25 * 0.9e-3, 1e-12, 0);
    c.schedule = DT_SCHED_CONSTANT;
    CHECK_NEAR_REL(dt_optim_lr(&c, 5), 6e-4, 1e-12, 0);
    CHECK_NEAR_REL(dt_optim_lr(&c, 100), 1e-3, 1e-12, 0);
    c.warmup_steps = 0;
    c.schedule = DT_SCHED_COSINE;
    CHECK_NEAR_REL(dt_optim_lr(&c, 0), 1e-3, 1e-12, 0);
}

static void test_step(double clip) {
    dt_backend *be;
    CHECK(dt_backend_open(DT_DEVICE_CPU, &(dt_backend_cfg){.threads = 1}, &be) == DT_OK);
    enum { N = 7 };
    /* two segments: a "matrix" [0,4) with decay, a "bias" [4,7) without */
    dt_param_seg segs[2] = {{0, 4, 1}, {4, 3, 0}};
    dt_optim_cfg c = {.lr = 0.1, .weight_decay = 0.5, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .grad_clip = clip,
                      .schedule = DT_SCHED_CONSTANT, .total_steps = 3};
    dt_optim *o;
    float *p, *g;
    CHECK(dt_optim_init(&o, &c, be, N, segs, 2) == DT_OK);
    CHECK(be->ops->alloc(be->ctx, N * sizeof(float), "p", (void **)&p) == DT_OK);
    CHECK(be->ops->alloc(be->ctx, N * sizeof(float), "g", (void **)&g) == DT_OK);
    double rp[N], rm[N] = {0}, rv[N] = {0};
    for (int i = 0; i < N; i++) rp[i] = p[i] = (float)(0.3 * i - 1.0);
    for (int step = 0; step < 3; step++) {
        double rg[N], norm = 0;
        for (int i = 0; i < N; i++) {
            g[i] = (float)((i + 1) * (step % 2 ? -0.7 : 0.4));
            rg[i] = g[i];
            norm += rg[i] * rg[i];
        }
        norm = sqrt(norm);
        double gn, lr;
        CHECK(dt_optim_step(o, p, g, step, &gn, &lr) == DT_OK);
        CHECK_NEAR_REL(gn, norm, 1e-6, 0);
        CHECK_NEAR_REL(lr, 0.1, 1e-12, 0);
        double f = (clip > 0 && norm > clip) ? clip / (norm + 1e-6) : 1.0;
        int t = step + 1;
        for (int i = 0; i < N; i++) {
            double gi = rg[i] * f, wd = i < 4 ? 0.5 : 0.0;
            rp[i] -= 0.1 * wd * rp[i];
            rm[i] = 0.9 * rm[i] + 0.1 * gi;
            rv[i] = 0.99 * rv[i] + 0.01 * gi * gi;
            double mh = rm[i] / (1 - pow(0.9, t)), vh = rv[i] / (1 - pow(0.99, t));
            rp[i] -= 0.1 * mh / (sqrt(vh) + 1e-8);
        }
        for (int i = 0; i < N; i++) CHECK_NEAR_REL(p[i], rp[i], 1e-5, 1e-6);
        if (f < 1.0) { /* clipped grads have the clip norm */
            double s = 0;
            for (int i = 0; i < N; i++) s += (double)g[i] * g[i];
            CHECK_NEAR_REL(sqrt(s), clip, 1e-5, 0);
        }
    }
    /* a non-finite gradient is refused with a message, and parameters stay */
    float before = p[0];
    g[2] = NAN;
    double gn, lr;
    CHECK(dt_optim_step(o, p, g, 3, &gn, &lr) == DT_ERR_INTERNAL);
    CHECK_STR_CONTAINS(dt_error_msg(), "step 4: gradient norm is nan");
    CHECK(p[0] == before);
    be->ops->free(be->ctx, p);
    be->ops->free(be->ctx, g);
    dt_optim_free(o);
    dt_backend_close(be);
}

int main(void) {
    test_schedules();
    test_step(0.0);  /* no clipping */
    test_step(1.0);  /* norms ~2..3.7: always clipped */
    TEST_PASS("test_optim");
}
