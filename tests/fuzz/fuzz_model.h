/* fuzz_model.h — the tiny classifier the checkpoint target loads into and gen_seeds saves
 * its seed checkpoint from (one shape, so that the seed loads). */
#ifndef DTRAIN_FUZZ_MODEL_H
#define DTRAIN_FUZZ_MODEL_H

#include <stdio.h>
#include <stdlib.h>

#include "dtrain/backend.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"

typedef struct fuzz_model {
    dt_backend *be;
    dt_model *m;
    dt_optim *o;
} fuzz_model;

static inline dt_model_cfg fuzz_model_cfg(void) {
    dt_model_cfg c = {.shape = {.vocab_size = 8, .n_positions = 4, .n_layer = 1, .n_head = 1, .n_embd = 4, .num_labels = 2},
                      .seq_len = 4, .max_batch = 1, .seed = 3};
    return c;
}

static inline void fuzz_model_init(fuzz_model *f) {
    dt_model_cfg mc = fuzz_model_cfg();
    dt_param_seg segs[64];
    dt_optim_cfg oc = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .total_steps = 10};
    if (dt_backend_open(DT_DEVICE_CPU, &(dt_backend_cfg){.threads = 1}, &f->be) != DT_OK ||
        dt_model_init(&f->m, &mc, f->be) != DT_OK) {
        fprintf(stderr, "fuzz: the fixture model: %s\n", dt_error_msg());
        abort();
    }
    int nt = dt_model_num_tensors(f->m);
    for (int i = 0; i < nt; i++) {
        const dt_tensor_info *t = dt_model_tensor(f->m, i);
        segs[i] = (dt_param_seg){t->offset, t->numel, t->ndim >= 2};
    }
    if (dt_optim_init(&f->o, &oc, f->be, dt_model_num_params(f->m), segs, nt) != DT_OK) {
        fprintf(stderr, "fuzz: the fixture optimizer: %s\n", dt_error_msg());
        abort();
    }
}

static inline void fuzz_model_free(fuzz_model *f) {
    dt_optim_free(f->o);
    dt_model_free(f->m);
    dt_backend_close(f->be);
}

#endif
