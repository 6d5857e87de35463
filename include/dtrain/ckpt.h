/* ckpt.h — checkpoints (DESIGN.md §6): save, verify, find the newest valid one, load.
 *
 * Layout: RUN/checkpoints/step_NNNNNNNN/
 *   model.safetensors      weights, F32, HF GPT-2 names (DESIGN §4): other tools load it
 *   optimizer.safetensors  AdamW moments, F32: exp_avg.<name> and exp_avg_sq.<name> for every
 *                          weight tensor, same shapes
 *   trainer.json           where training stands: step, epoch, sample cursor, seed, config
 *                          digest, world size and global batch at save, model shape, the
 *                          SHA-256 of data.tokenizer's file (none for the byte tokenizer), and
 *                          (when checkpoint.best_metric or early stopping counts) the best
 *                          evaluation
 * RUN/best/ is a checkpoint of the same layout: the best evaluation's (dt_ckpt_save_best).
 *   config.yaml            the resolved config at save
 *   manifest.json          size and CRC32 (zlib) of each file above; written last
 * A checkpoint appears whole or not at all: everything is written into
 * checkpoints/.tmp-step_N.PID, each file fsynced, the directory fsynced, renamed to step_N
 * and checkpoints/ fsynced. Deleting (prune, a replaced step, leftovers) never follows a
 * link: a symbolic link found where a checkpoint directory is expected (step_N, .tmp-*,
 * .old-*) is itself removed, its target left as it is; files are created O_EXCL|O_NOFOLLOW.
 * State is global (identical on every rank), so a checkpoint
 * resumes on any number of workers. */
#ifndef DTRAIN_CKPT_H
#define DTRAIN_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/config.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"
#include "dtrain/status.h"

/* checkpoint.best_metric and training.early_stopping_patience: where they stand. */
typedef struct dt_ckpt_best {
    int has;                /* an evaluation has been counted */
    double value;           /* the best value of the metric so far */
    long step;              /* ... at this step */
    int evals_since;        /* evaluations since, none of them better */
    int stopped_early;      /* training ended there: a resume of this run only evaluates again */
} dt_ckpt_best;

typedef struct dt_ckpt_state {
    long step;              /* optimizer steps done */
    long epoch;             /* 0-based epoch the next step is in */
    size_t cursor;          /* samples of that epoch's order already consumed */
    uint64_t seed;          /* training.seed: with the epoch it fixes the sample order (the only RNG) */
    uint32_t config_digest; /* dt_config_digest at save */
    int world;              /* workers at save */
    long global_batch;      /* samples per step at save */
    size_t train_samples;   /* training set size at save */
    dt_model_shape model;   /* the model's architecture and shape at save */
    char tokenizer_sha256[65]; /* verify: trainer.json's, data.tokenizer's SHA-256 at save ("": the byte
                                  tokenizer, or a checkpoint from before it was recorded); save writes
                                  the config's, not this */
    dt_ckpt_best best;      /* optional in trainer.json ("best"): all 0 when absent */
    /* model.lora at save (optional in trainer.json, "lora"; rank 0: none): the adapters' shape,
     * and the frozen base they apply to, as dt_model_frozen_digest and where it came from
     * (model.init_from; "": the seed's) */
    dt_lora lora;
    uint32_t lora_base_digest;
    char lora_base[DT_PATH_MAX];
    /* saving only: when set, where arrays that other workers hold parts of come from: array
     * `which` (0: the weights, 1: exp_avg, 2: exp_avg_sq) whole in *whole (the whole model's
     * layout, dt_model_whole_params floats; valid until the next call), called for 0, 1 and 2 in
     * turn as the files reach them (the others gather with it; a save that fails first leaves the
     * rest uncalled). *whole NULL: not gathered, the model's and optimizer's own are written.
     * Model parallelism gathers every array to rank 0's host; ZeRO-1 alone gathers only the
     * moments, into backend memory (whole_on_backend). */
    dt_status (*gather)(void *user, int which, const float **whole);
    int whole_on_backend;
    void *user;
} dt_ckpt_state;

/* Writes checkpoints/step_<s->step> under run_dir as described above (replacing an existing
 * checkpoint of the same step only once the new one is complete). *dir_out (n bytes, may be
 * NULL) receives its path. */
dt_status dt_ckpt_save(const char *run_dir, dt_model *m, dt_optim *o, const dt_ckpt_state *s, const dt_config *cfg,
                       char *dir_out, size_t n);

/* The same checkpoint, written as run_dir/best (replaced whole, atomically): the weights of the
 * best evaluation so far (checkpoint.best_metric). dt_ckpt_verify and dt_ckpt_load read it like
 * any checkpoint; dt_ckpt_find_latest of the run directory never picks it. */
dt_status dt_ckpt_save_best(const char *run_dir, dt_model *m, dt_optim *o, const dt_ckpt_state *s,
                            const dt_config *cfg, char *dir_out, size_t n);

/* Deletes all but the newest keep_last complete checkpoints, and the leftovers of writers that
 * died: checkpoints/.tmp-step_* and run_dir/.tmp-best.*, and .old-step_* / .old-best.* once the
 * checkpoint they were replaced by is there; links among them are unlinked, never followed (see
 * above). Only call while no checkpoint is being written. */
dt_status dt_ckpt_prune(const char *run_dir, int keep_last);

/* Checks the manifest, each file's size and CRC32, and parses trainer.json into *s.
 * DT_ERR_DATA naming the file and what failed. */
dt_status dt_ckpt_verify(const char *ckpt_dir, dt_ckpt_state *s);

/* Called for each checkpoint that is skipped because it failed verification. */
typedef void (*dt_ckpt_report_fn)(void *user, const char *msg);

/* The newest checkpoint under `dir` that verifies: `dir` is a run directory (its
 * checkpoints/ is searched) or a checkpoint directory itself. Newer broken ones (DT_ERR_DATA)
 * are reported and skipped; an I/O error while reading one is returned (a retry may find it
 * whole). *found = 0 (and DT_OK) when there is none. */
dt_status dt_ckpt_find_latest(const char *dir, dt_ckpt_report_fn report, void *user, char *dir_out, size_t n,
                              dt_ckpt_state *s, int *found);

/* Refuses (DT_ERR_CONFIG, naming both values and a hint) when the checkpoint's model shape
 * differs from `mc`. */
dt_status dt_ckpt_check_shape(const dt_ckpt_state *s, const dt_model_shape *now, const char *ckpt_dir);

/* Refuses (DT_ERR_CONFIG, naming the checkpoint, both hashes and a hint) to resume a checkpoint
 * that recorded a tokenizer (trainer.json's tokenizer_sha256) with another one: cfg's
 * data.tokenizer_sha256 differs (another file, or bytes). A checkpoint that recorded none (the
 * byte tokenizer, or written before dtrain recorded it) resumes with any. */
dt_status dt_ckpt_check_tokenizer(const dt_ckpt_state *s, const dt_config *cfg, const char *ckpt_dir);
/* DT_ERR_CONFIG naming what differs when the checkpoint's model.lora (rank, alpha, targets;
 * none) is not `now`. */
dt_status dt_ckpt_check_lora(const dt_ckpt_state *s, const dt_lora *now, const char *ckpt_dir);

/* Loads the weights and the optimizer moments of a verified checkpoint. */
dt_status dt_ckpt_load(const char *ckpt_dir, dt_model *m, dt_optim *o);

/* Moves the checkpoints of run_dir with a step > after_step (all of them when after_step < 0)
 * aside into run_dir/checkpoints.prev-YYYYmmdd-HHMMSS, deleting nothing: for a fresh start
 * (checkpoint.resume: never), and so that checkpoints newer than the one a run resumed from
 * (broken ones, or a history the user rolled back from) are neither resumed after a restart
 * nor counted by keep_last. *moved_to (n bytes) receives the directory, or "" when nothing
 * was moved. */
dt_status dt_ckpt_set_aside(const char *run_dir, long after_step, char *moved_to, size_t n);

#endif
