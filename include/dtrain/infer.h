/* infer.h — what every command that runs a trained model shares (eval, generate, predict, the
 * trainer): the weights file and the config a --checkpoint names, and the backend, tokenizer
 * and model built from a config. */
#ifndef DTRAIN_INFER_H
#define DTRAIN_INFER_H

#include <stddef.h>
#include <stdio.h>

#include "dtrain/backend.h"
#include "dtrain/config.h"
#include "dtrain/model.h"
#include "dtrain/status.h"
#include "dtrain/tokenizer.h"

/* The weights `checkpoint` names: the path itself when it is a file; DIR/model.safetensors of a
 * finished run or a checkpoint directory; for a run that has no final weights yet (unfinished,
 * stopped, failed), its newest valid checkpoint's (said on `say`, unless NULL, with any
 * checkpoint skipped as broken); a Hugging Face directory's model.safetensors. DT_ERR_DATA when a directory has neither. */
dt_status dt_infer_weights_path(const char *checkpoint, FILE *say, char *buf, size_t n);

/* The adapters model.lora.init_from names: a PEFT adapter directory's adapter_model.safetensors,
 * or the file itself (the loader refuses a file without adapters). */
void dt_infer_adapters_path(const char *from, char *buf, size_t n);

/* The model shape of config c for batches of `batch` sequences of seq_len tokens (pad_id 0). */
dt_model_cfg dt_infer_model_cfg(const dt_config *c, int batch, int seq_len);
/* data.tokenizer opened: NULL for "bytes" (as dt_dataset_cfg takes it); DT_ERR_DATA naming the
 * key and the file. Checked against the model as training checks it (dt_data_check_tokenizer:
 * its ids within model.vocab_size, a classifier's end-of-text token and 16-bit ids):
 * DT_ERR_CONFIG otherwise, *out NULL. Every command that pairs a tokenizer with a model
 * (train, eval, predict, generate, export, --dry-run) opens it here. */
dt_status dt_infer_tokenizer(const dt_config *c, dt_tokenizer **out);

/* dt_infer_build's `how`: backward ops too (training); the forwards read the config's data rows
 * (training, evaluation: packed ones with data.packing, else plain sequences) */
#define DT_INFER_TRAIN 1
#define DT_INFER_DATA_ROWS 2
/* The backend (device local_rank, as rank `rank` in messages), the tokenizer (data.tokenizer's
 * tokenizer.json; NULL for "bytes", as dt_dataset_cfg takes it) and the model of config c for
 * batches of `batch` sequences of seq_len tokens (its scratch reserved; for forward ops only
 * unless how has DT_INFER_TRAIN). Each out is NULL on failure; the caller frees them
 * (dt_model_free, dt_tokenizer_free, dt_backend_close, in that order). */
dt_status dt_infer_build(const dt_config *c, int local_rank, int rank, int batch, int seq_len, int how,
                         dt_backend **be, dt_tokenizer **tok, dt_model **model);
/* A model's part of a model-parallel mesh (dt_model_cfg's fields of the same names): share
 * tp_rank of tp (tensor parallelism over tp_comm), stage pp_rank of pp keeping act_sets
 * micro-batches' activations (pipeline parallelism). */
typedef struct dt_infer_share {
    int tp, tp_rank;
    dt_comm *tp_comm;
    int pp, pp_rank, act_sets;
} dt_infer_share;
/* The same with the model as `share` (NULL: the whole model, as dt_infer_build). */
dt_status dt_infer_build_share(const dt_config *c, int local_rank, int rank, int batch, int seq_len, int how,
                               const dt_infer_share *share, dt_backend **be, dt_tokenizer **tok, dt_model **model);

/* The weights file `weights` into model m of config c (dt_model_load); with model.lora, first
 * the frozen base its adapters apply to, model.init_from's (errors prefixed with the key). */
dt_status dt_infer_load_weights(const dt_config *c, dt_model *m, const char *weights, int *score_loaded);

/* A trained model opened for inference. */
typedef struct dt_infer {
    dt_config cfg;
    char weights[DT_PATH_MAX + 96];
    char config_path[DT_PATH_MAX + 32];
    dt_backend *be;
    dt_tokenizer *tok; /* NULL: the byte tokenizer */
    dt_model *model;
} dt_infer;

typedef struct dt_infer_opts {
    const char *cmd;        /* "generate", in messages */
    const char *checkpoint; /* --checkpoint (NULL: the config's model.init_from) */
    const char *config;     /* --config (NULL: the config.yaml saved next to the weights) */
    const char *const *overrides;
    int n_overrides;
    FILE *say;              /* where the choice of weights and config is said (NULL: stderr) */
    int batch, seq_len;     /* the model's batch shape (batch 0: data.batch_size_per_worker for a
                               classifier, 1 for a language model; seq_len 0: data.seq_len) */
} dt_infer_opts;

/* Resolves the weights and the config (a checkpoint directory and a run directory hold the
 * config.yaml they were trained with; what is said about the choice goes to stderr, so that
 * stdout holds only a command's output), builds the model and loads the weights. DT_ERR_USAGE
 * naming the option when neither names what is needed; s is closed on failure. */
dt_status dt_infer_open(dt_infer *s, const dt_infer_opts *o);
/* The first half of dt_infer_open: s->weights, s->config_path and s->cfg only (nothing built). */
dt_status dt_infer_resolve(dt_infer *s, const dt_infer_opts *o);
/* The second half, on a resolved s: the backend, tokenizer and model of batch x seq_len (as
 * dt_infer_opts's), the weights loaded; s is closed on failure. */
dt_status dt_infer_load(dt_infer *s, int batch, int seq_len);
void dt_infer_close(dt_infer *s);

#endif
