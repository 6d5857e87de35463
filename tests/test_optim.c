/* test_optim.c — LR schedules, global-norm clipping and AdamW through dt_optim against a
 * double-precision reference of torch.optim.AdamW / clip_grad_norm_; and shards (ZeRO-1):
 * three optimizers over the parts of two buckets update, clip and keep moments as one
 * optimizer over everything does. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "dtrain/backend.h"
#include "dtrain/comm.h"
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

/* Three ranks' shards of two buckets ([0,13) and [13,37)) against one optimizer over all 37
 * floats, on the same gradients, clipped every step; segments cross the parts' edges. */
static void test_shards(void) {
    dt_backend *be;
    CHECK(dt_backend_open(DT_DEVICE_CPU, &(dt_backend_cfg){.threads = 1}, &be) == DT_OK);
    enum { N = 37, W = 3 };
    const dt_param_seg segs[4] = {{0, 10, 1}, {10, 3, 0}, {13, 17, 1}, {30, 7, 0}};
    const dt_range buckets[2] = {{0, 13}, {13, 24}};
    dt_optim_cfg c = {.lr = 0.05, .weight_decay = 0.3, .beta1 = 0.9, .beta2 = 0.99, .eps = 1e-8, .grad_clip = 0.5,
                      .schedule = DT_SCHED_CONSTANT, .total_steps = 4};
    dt_optim *whole, *shard[W];
    CHECK_OK(dt_optim_init(&whole, &c, be, N, segs, 4));
    float p[N], g[N], ps[W][N], gs[W][N];
    size_t owned = 0;
    for (int r = 0; r < W; r++) {
        dt_range own[2];
        for (int b = 0; b < 2; b++) {
            size_t lo, hi;
            dt_comm_part(buckets[b].numel, W, r, &lo, &hi);
            own[b] = (dt_range){buckets[b].offset + lo, hi - lo};
        }
        CHECK_OK(dt_optim_init_shard(&shard[r], &c, be, N, segs, 4, own, 2));
        owned += dt_optim_moment_floats(shard[r]);
    }
    CHECK_INT_EQ(owned, N);
    CHECK_INT_EQ(dt_optim_moment_floats(whole), N);
    for (int i = 0; i < N; i++) p[i] = (float)(0.2 * i - 3.0);
    for (int r = 0; r < W; r++) memcpy(ps[r], p, sizeof p);
    for (int step = 0; step < 4; step++) {
        for (int i = 0; i < N; i++) g[i] = (float)(sin(1.7 * i + step) * (1 + i % 5));
        for (int r = 0; r < W; r++) memcpy(gs[r], g, sizeof g);
        float before[N];
        memcpy(before, ps[0], sizeof before); /* every rank holds the same weights (gathered) */
        double gn, gn_s[W], lr, sumsq = 0, part[W];
        CHECK_OK(dt_optim_step(whole, p, g, step, &gn, &lr));
        for (int r = 0; r < W; r++) CHECK_OK(dt_optim_sumsq(shard[r], gs[r], &part[r]));
        for (int r = 0; r < W; r++) sumsq += part[r];
        for (int r = 0; r < W; r++) CHECK_OK(dt_optim_update(shard[r], ps[r], gs[r], step, sumsq, &gn_s[r], &lr));
        for (int r = 0; r < W; r++) CHECK_NEAR_REL(gn_s[r], gn, 1e-12, 0);
        /* each float updated by its owner alone, as the whole optimizer updates it; then the
         * all-gather gives every rank the owners' values */
        for (int i = 0; i < N; i++) {
            int owner = -1;
            for (int b = 0; b < 2; b++)
                for (int r = 0; r < W; r++) {
                    size_t lo, hi;
                    dt_comm_part(buckets[b].numel, W, r, &lo, &hi);
                    if ((size_t)i >= buckets[b].offset + lo && (size_t)i < buckets[b].offset + hi) owner = r;
                }
            CHECK(owner >= 0);
            CHECK_NEAR_REL(ps[owner][i], p[i], 1e-6, 1e-7);
            for (int r = 0; r < W; r++) {
                if (r != owner) CHECK(ps[r][i] == before[i]);
                ps[r][i] = ps[owner][i];
            }
        }
    }
    /* the moments: each shard's ranges, and in place in a full buffer */
    float m[N], v[N], ms[N], vs[N], full[N];
    CHECK_OK(dt_optim_get_moments(whole, m, v));
    for (int i = 0; i < N; i++) ms[i] = vs[i] = NAN;
    for (int r = 0; r < W; r++) CHECK_OK(dt_optim_get_moments(shard[r], ms, vs));
    for (int i = 0; i < N; i++) {
        CHECK_NEAR_REL(ms[i], m[i], 1e-6, 1e-9);
        CHECK_NEAR_REL(vs[i], v[i], 1e-6, 1e-9);
    }
    for (int i = 0; i < N; i++) full[i] = NAN;
    for (int r = 0; r < W; r++) dt_optim_place_moments(shard[r], 1, full);
    CHECK(memcmp(full, vs, sizeof full) == 0);
    /* set: a fresh shard takes its ranges of the whole arrays */
    dt_optim *again;
    const dt_range own1[2] = {{4, 5}, {21, 8}};
    CHECK_OK(dt_optim_init_shard(&again, &c, be, N, segs, 4, own1, 2));
    dt_optim_set_moments(again, m, v);
    for (int i = 0; i < N; i++) full[i] = -1;
    dt_optim_place_moments(again, 0, full);
    for (int i = 0; i < N; i++) CHECK(full[i] == ((i >= 4 && i < 9) || (i >= 21 && i < 29) ? m[i] : -1));
    /* a part at a time (a checkpoint's load and save): windows across the ranges' ends, each moment
     * alone; what the shard does not hold is neither set nor read */
    float w[N];
    for (int i = 0; i < N; i++) w[i] = (float)(100 + i);
    for (size_t lo = 0; lo < N; lo += 6) dt_optim_set_range(again, 1, lo, N - lo < 6 ? N - lo : 6, w + lo);
    for (int i = 0; i < N; i++) full[i] = -1;
    dt_optim_place_moments(again, 1, full);
    for (int i = 0; i < N; i++) CHECK(full[i] == ((i >= 4 && i < 9) || (i >= 21 && i < 29) ? w[i] : -1));
    dt_optim_place_moments(again, 0, full); /* the first moments unchanged */
    for (int i = 0; i < N; i++) CHECK(full[i] == ((i >= 4 && i < 9) || (i >= 21 && i < 29) ? m[i] : -1));
    for (int i = 0; i < N; i++) full[i] = -1;
    for (size_t lo = 3; lo < 30; lo += 5) dt_optim_get_range(again, 1, lo, 5, full + lo);
    for (int i = 0; i < N; i++) CHECK(full[i] == ((i >= 4 && i < 9) || (i >= 21 && i < 29) ? w[i] : -1));
    dt_optim_free(again);
    /* ranges out of order or outside the parameters are refused */
    const dt_range bad[2] = {{10, 5}, {12, 3}};
    CHECK_INT_EQ(dt_optim_init_shard(&again, &c, be, N, segs, 4, bad, 2), DT_ERR_INTERNAL);
    const dt_range out[1] = {{30, 8}};
    CHECK_INT_EQ(dt_optim_init_shard(&again, &c, be, N, segs, 4, out, 1), DT_ERR_INTERNAL);
    for (int r = 0; r < W; r++) dt_optim_free(shard[r]);
    dt_optim_free(whole);
    dt_backend_close(be);
}

int main(void) {
    test_schedules();
    test_step(0.0);  /* no clipping */
    test_step(1.0);  /* norms ~2..3.7: always clipped */
    test_shards();
    TEST_PASS("test_optim");
}
