/* infer.c — weights and config from --checkpoint; backend, tokenizer and model from a config. */
#include "dtrain/infer.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/ckpt.h"
#include "dtrain/device.h"
#include "dtrain/hfdir.h"

static void say_skipped(void *user, const char *msg) {
    if (user) fprintf(user, "checkpoint skipped: %s\n", msg);
}

dt_status dt_infer_weights_path(const char *checkpoint, FILE *say, char *buf, size_t n) {
    struct stat sb;
    snprintf(buf, n, "%s", checkpoint);
    if (stat(checkpoint, &sb) != 0 || !S_ISDIR(sb.st_mode)) return DT_OK;
    snprintf(buf, n, "%s/model.safetensors", checkpoint);
    if (access(buf, F_OK) == 0) return DT_OK;
    char dir[DT_PATH_MAX + 64];
    dt_ckpt_state s;
    int found = 0;
    DT_TRY(dt_ckpt_find_latest(checkpoint, say_skipped, say, dir, sizeof dir, &s, &found));
    if (!found)
        return dt_error_set(DT_ERR_DATA, "%s: no model.safetensors and no valid checkpoint in it (expected a run "
                                         "directory, a checkpoint directory or a .safetensors file)", checkpoint);
    snprintf(buf, n, "%s/model.safetensors", dir);
    if (say) fprintf(say, "%s has no final weights yet: using its newest valid checkpoint, %s (step %ld)\n", checkpoint, dir,
            s.step);
    return DT_OK;
}

void dt_infer_adapters_path(const char *from, char *buf, size_t n) {
    struct stat sb;
    if (stat(from, &sb) == 0 && S_ISDIR(sb.st_mode)) snprintf(buf, n, "%s/adapter_model.safetensors", from);
    else snprintf(buf, n, "%s", from);
}

/* training.precision as dt_backend_cfg has it: 1 bf16, 0 fp32, -1 auto */
static int backend_precision(const dt_config *c) {
    return c->training.precision == DT_PREC_FP32 ? 0 : c->training.precision == DT_PREC_BF16 ? 1 : -1;
}

dt_model_cfg dt_infer_model_cfg(const dt_config *c, int batch, int seq_len) {
    dt_model_cfg mc = {.shape = c->model.shape, .seq_len = seq_len, .max_batch = batch, .seed = c->training.seed,
                       .lora = c->model.lora};
    if (!mc.lora.rank) mc.lora = (dt_lora){0};
    return mc;
}

dt_status dt_infer_tokenizer(const dt_config *c, dt_tokenizer **out) {
    *out = NULL;
    if (strcmp(c->data.tokenizer, "bytes") != 0 && dt_tokenizer_open(c->data.tokenizer, out) != DT_OK) {
        dt_error_prefix("data.tokenizer");
        return DT_ERR_DATA;
    }
    dt_status st = dt_tokenizer_check_model(*out, c->model.shape.vocab_size, c->model.shape.num_labels);
    if (st != DT_OK) {
        dt_tokenizer_free(*out);
        *out = NULL;
    }
    return st;
}

dt_status dt_infer_build(const dt_config *c, int local_rank, int rank, int batch, int seq_len, int how,
                         dt_backend **be, dt_tokenizer **tok, dt_model **model) {
    return dt_infer_build_share(c, local_rank, rank, batch, seq_len, how, NULL, be, tok, model);
}

dt_status dt_infer_build_share(const dt_config *c, int local_rank, int rank, int batch, int seq_len, int how,
                               const dt_infer_share *share, dt_backend **be, dt_tokenizer **tok, dt_model **model) {
    const int training = (how & DT_INFER_TRAIN) != 0;
    *be = NULL;
    *tok = NULL;
    *model = NULL;
    dt_device_kind dev;
    DT_TRY(dt_backend_resolve(c, &dev));
    dt_backend_cfg bc = {.device = local_rank, .precision = backend_precision(c), .rank = rank,
                         .threads = dt_device_threads_per_worker(c), .inference = !training};
    DT_TRY(dt_backend_open(dev, &bc, be));
    DT_TRY(dt_infer_tokenizer(c, tok));
    dt_model_cfg mc = dt_infer_model_cfg(c, batch, seq_len);
    mc.packed = (how & DT_INFER_DATA_ROWS) && c->data.packing; /* the rows it trains and evaluates on */
    if (*tok && mc.shape.num_labels) mc.pad_id = dt_tokenizer_eot(*tok); /* BPE texts are padded with it; bytes with 0 */
    if (share) {
        mc.tp = share->tp;
        mc.tp_rank = share->tp_rank;
        mc.tp_comm = share->tp_comm;
        mc.pp = share->pp;
        mc.pp_rank = share->pp_rank;
        mc.act_sets = share->act_sets;
    }
    dt_op_sizes sizes;
    dt_model_op_sizes(&mc, &sizes);
    DT_TRY(dt_model_init(model, &mc, *be));
    return (*be)->ops->reserve((*be)->ctx, &sizes);
}

/* `s` into a YAML double-quoted scalar (dst of n bytes) */
static void yaml_quote(char *dst, size_t n, const char *s) {
    size_t k = 0;
    if (k + 1 < n) dst[k++] = '"';
    for (; *s && k + 3 < n; s++) {
        if (*s == '"' || *s == '\\') dst[k++] = '\\';
        dst[k++] = *s;
    }
    if (k + 1 < n) dst[k++] = '"';
    dst[k] = '\0';
}

/* A Hugging Face directory has no config.yaml: its config.json gives the model (init_from
 * takes the shape and the tokenizer from it), tokenizer_config.json's model_max_length (what an
 * export wrote: the training data.seq_len), else n_positions, the sequence length. */
static dt_status hf_config(dt_infer *s, const dt_infer_opts *o, const char *dir) {
    for (const char *p = dir; *p; p++) /* kept out of the YAML: ${ would read the environment */
        if ((unsigned char)*p < 0x20 || *p == 0x7f || (p[0] == '$' && p[1] == '{'))
            return dt_error_set(DT_ERR_USAGE, "%s: %s has no config.yaml, and its name cannot go into one: pass "
                                "--config FILE", o->cmd, dir);
    dt_hf_config hc;
    DT_TRY(dt_hf_read_config(dir, &hc));
    char q[2 * DT_PATH_MAX + 8], yaml[4 * DT_PATH_MAX + 256];
    yaml_quote(q, sizeof q, dir);
    snprintf(yaml, sizeof yaml, "data:\n  train_path: %s\n  seq_len: %d\nmodel:\n  init_from: %s\n  num_labels: %d\n", q,
             hc.max_length ? hc.max_length : hc.shape.n_positions, q, hc.shape.num_labels);
    snprintf(s->config_path, sizeof s->config_path, "%s/config.json", dir);
    fprintf(o->say ? o->say : stderr, "%s: the model of %s (no config.yaml: a Hugging Face directory)\n", o->cmd,
            s->config_path);
    return dt_config_load_string(&s->cfg, s->config_path, yaml, o->overrides, o->n_overrides);
}

/* --config, else the config.yaml in the weights' directory, else its config.json (*loaded: the
 * config is in s->cfg already) */
static dt_status find_config(dt_infer *s, const dt_infer_opts *o, int *loaded) {
    *loaded = 0;
    if (o->config) {
        snprintf(s->config_path, sizeof s->config_path, "%s", o->config);
        return DT_OK;
    }
    char dir[sizeof s->weights];
    snprintf(dir, sizeof dir, "%s", s->weights);
    const char *d = dirname(dir);
    snprintf(s->config_path, sizeof s->config_path, "%s/config.yaml", d);
    if (access(s->config_path, R_OK) == 0) return DT_OK;
    if (dt_hf_is_dir(d)) {
        *loaded = 1;
        return hf_config(s, o, d);
    }
    return dt_error_set(DT_ERR_USAGE, "%s: no config.yaml next to %s: pass --config FILE (the config the model was "
                        "trained with)", o->cmd, s->weights);
}

dt_status dt_infer_resolve(dt_infer *s, const dt_infer_opts *o) {
    memset(s, 0, sizeof *s);
    dt_status st = DT_OK;
    if (o->checkpoint) {
        DT_TRY(dt_infer_weights_path(o->checkpoint, o->say ? o->say : stderr, s->weights, sizeof s->weights));
    } else if (!o->config) {
        return dt_error_set(DT_ERR_USAGE, "%s: needs --checkpoint DIR|FILE (or --config FILE with model.init_from)",
                            o->cmd);
    }
    int loaded = 0;
    if (o->checkpoint) DT_TRY(find_config(s, o, &loaded));
    else snprintf(s->config_path, sizeof s->config_path, "%s", o->config);
    if (!loaded && o->checkpoint && !o->config) {
        /* the config.yaml a run saved: every key resolved; its model.init_from is history (the
         * weights are the checkpoint's), not checked again against a directory that may have
         * changed or gone since */
        const char **ov = malloc(((size_t)o->n_overrides + 1) * sizeof *ov);
        if (!ov) return dt_error_set(DT_ERR_NOMEM, "out of memory");
        ov[0] = "model.init_from=";
        for (int i = 0; i < o->n_overrides; i++) ov[i + 1] = o->overrides[i];
        st = dt_config_load(&s->cfg, s->config_path, ov, o->n_overrides + 1);
        /* but a LoRA run's weights are adapters: they apply to its model.init_from, loaded first */
        if (st == DT_OK && s->cfg.model.lora.rank)
            st = dt_config_load(&s->cfg, s->config_path, ov + 1, o->n_overrides);
        free(ov);
    } else if (!loaded) {
        st = dt_config_load(&s->cfg, s->config_path, o->overrides, o->n_overrides);
    }
    if (st == DT_ERR_IO) st = DT_ERR_USAGE; /* a config that cannot be read is bad input */
    if (st != DT_OK) return st;
    if (!o->checkpoint) {
        if (!s->cfg.model.init_from[0])
            return dt_error_set(DT_ERR_USAGE, "%s: needs --checkpoint DIR|FILE (%s has no model.init_from)", o->cmd,
                                s->config_path);
        DT_TRY(dt_infer_weights_path(s->cfg.model.init_from, o->say ? o->say : stderr, s->weights, sizeof s->weights));
    }
    return DT_OK;
}

dt_status dt_infer_open(dt_infer *s, const dt_infer_opts *o) {
    DT_TRY(dt_infer_resolve(s, o));
    return dt_infer_load(s, o->batch, o->seq_len);
}

dt_status dt_infer_load_weights(const dt_config *c, dt_model *m, const char *weights, int *score_loaded) {
    if (c->model.lora.rank && c->model.init_from[0]) { /* the frozen base the adapters apply to */
        char base[DT_PATH_MAX + 96];
        dt_status st = dt_infer_weights_path(c->model.init_from, NULL, base, sizeof base);
        if (st == DT_OK && strcmp(base, weights) != 0) st = dt_model_load(m, base, NULL);
        if (st != DT_OK) {
            dt_error_prefix("model.init_from (model.lora's base)");
            return st;
        }
    }
    return dt_model_load(m, weights, score_loaded);
}

dt_status dt_infer_load(dt_infer *s, int batch_in, int seq_len) {
    dt_status st = DT_OK;
    /* batch 0: data.batch_size_per_worker (one sequence for a language model, scored line by line) */
    const int batch = batch_in ? batch_in : s->cfg.model.shape.num_labels ? s->cfg.data.batch_size_per_worker : 1;
    st = dt_infer_build(&s->cfg, 0, 0, batch, seq_len ? seq_len : s->cfg.data.seq_len, 0, &s->be, &s->tok,
                        &s->model);
    int score_loaded = 1;
    if (st == DT_OK) st = dt_infer_load_weights(&s->cfg, s->model, s->weights, &score_loaded);
    if (st == DT_OK && !score_loaded && s->cfg.model.shape.num_labels > 0)
        st = dt_error_set(DT_ERR_DATA, "%s: tensor score.weight is missing: the file has no classification head",
                          s->weights);
    if (st != DT_OK) dt_infer_close(s);
    return st;
}

void dt_infer_close(dt_infer *s) {
    dt_model_free(s->model);
    dt_tokenizer_free(s->tok);
    dt_backend_close(s->be);
    s->model = NULL;
    s->tok = NULL;
    s->be = NULL;
}
