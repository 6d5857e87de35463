/* datashow.h — `dtrain data show`: the first examples of a config's training data as the model
 * reads them, and which tokens count in the loss (chat and completion data: the answer's).
 *
 * Text form, one block an example: a header (example i, tokens, how many count) and the row's
 * tokens decoded, the counted runs between «» (a target counts: the token it predicts is shown
 * inside). --json: one line an example, {"example": i, "ids": [...], "targets": [...]} with -1
 * for a target that does not count (what the loss sees; for tools and tests). */
#ifndef DTRAIN_DATASHOW_H
#define DTRAIN_DATASHOW_H

#include <stdio.h>

#include "dtrain/config.h"
#include "dtrain/status.h"

typedef struct dt_datashow_opts {
    long limit; /* examples to show from the start of data.train_path */
    int json;
} dt_datashow_opts;

dt_status dt_datashow(const dt_config *cfg, const dt_datashow_opts *o, FILE *out);

#endif
