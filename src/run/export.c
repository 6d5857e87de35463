/* export.c — dtrain export: one safetensors file, or a Hugging Face directory (export.h). */
#include "dtrain/export.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/file.h"
#include "dtrain/hfdir.h"
#include "dtrain/infer.h"
#include "dtrain/jsonfile.h"
#include "dtrain/safetensors.h"

/* ---- --format safetensors: the file's tensors as they are, in F32 ---- */

static dt_status export_file(const char *weights, const char *out, int *n_out) {
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(&f, weights));
    int n = dt_st_count(f);
    dt_st_entry *e = calloc((size_t)(n ? n : 1), sizeof *e);
    float **bufs = calloc((size_t)(n ? n : 1), sizeof *bufs);
    dt_status st = DT_OK;
    if (!e || !bufs) st = dt_error_set(DT_ERR_NOMEM, "out of memory exporting %s", weights);
    for (int i = 0; st == DT_OK && i < n; i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        bufs[i] = dt_malloc(t->numel * sizeof(float), t->name);
        if (!bufs[i]) { st = DT_ERR_NOMEM; break; }
        if ((st = dt_st_read_f32(f, t, bufs[i])) != DT_OK) break;
        e[i].name = t->name;
        e[i].ndim = t->ndim;
        memcpy(e[i].shape, t->shape, sizeof e[i].shape);
        e[i].data = bufs[i];
    }
    if (st == DT_OK) {
        const char *keys[] = {"format", "producer"}, *vals[] = {"pt", "dtrain"};
        st = dt_st_write(out, e, n, keys, vals, 2);
    }
    for (int i = 0; bufs && i < n; i++) free(bufs[i]);
    free(bufs);
    free(e);
    dt_st_close(f);
    *n_out = n;
    return st;
}

/* ---- --format hf: a directory ---- */

static const char *const hf_files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                                       "adapter_config.json", "adapter_model.safetensors"}; /* hf's, peft's */
#define N_HF_FILES (int)(sizeof hf_files / sizeof *hf_files)

static int is_hf_file(const char *name) {
    for (int i = 0; i < N_HF_FILES; i++)
        if (strcmp(name, hf_files[i]) == 0) return 1;
    return 0;
}

/* An existing --out must be a directory holding only what export writes (an earlier export):
 * nothing else of the user's is ever removed. *exists: it is there. */
static dt_status check_out(const char *out, int *exists) {
    struct stat sb;
    *exists = lstat(out, &sb) == 0;
    if (!*exists) return errno == ENOENT ? DT_OK : dt_error_set(DT_ERR_USAGE, "--out %s: %s", out, strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return dt_error_set(DT_ERR_USAGE, "--out %s: exists and is not a directory (--format hf writes a directory)",
                            out);
    DIR *d = opendir(out);
    if (!d) return dt_error_set(DT_ERR_USAGE, "--out %s: cannot open: %s", out, strerror(errno));
    struct dirent *e;
    dt_status st = DT_OK;
    while (st == DT_OK && (e = readdir(d)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0 && !is_hf_file(e->d_name))
            st = dt_error_set(DT_ERR_USAGE, "--out %s: holds %s, which export does not write: it replaces only an "
                              "earlier export (hint: a new or empty directory)", out, e->d_name);
    closedir(d);
    return st;
}

/* Removes the files export writes from dir, then dir (nothing else is there: check_out). */
static void remove_export(const char *dir) {
    char p[DT_PATH_MAX + 64];
    for (int i = 0; i < N_HF_FILES; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, hf_files[i]);
        unlink(p);
    }
    rmdir(dir);
}

static dt_status fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return dt_error_set(DT_ERR_IO, "%s: cannot sync: %s", dir, strerror(e));
    }
    close(fd);
    return DT_OK;
}

/* A copy of the tokenizer.json the model was trained with, byte for byte. */
static dt_status copy_file(const char *from, const char *to) {
    int fd;
    DT_TRY(dt_file_open_regular(from, DT_ERR_DATA, &fd));
    struct stat sb;
    char *buf = NULL;
    ssize_t got = -1;
    if (fstat(fd, &sb) == 0 && (buf = malloc((size_t)sb.st_size + 1)) != NULL) {
        size_t done = 0;
        while (done < (size_t)sb.st_size && (got = read(fd, buf + done, (size_t)sb.st_size - done)) > 0) done += (size_t)got;
        got = done == (size_t)sb.st_size ? (ssize_t)done : -1;
    }
    close(fd);
    dt_status st = got < 0 ? dt_error_set(DT_ERR_IO, "%s: cannot read", from) : dt_file_write_new(to, buf, (size_t)got);
    free(buf);
    return st;
}

/* What the exported tokenizer_config.json and config.json say of the special tokens: those of
 * the tokenizer_config.json beside the model's tokenizer.json (a Hugging Face model's: its
 * chat template, bos, eos and unk carried over), else the end-of-text token as all of them. */
typedef struct export_tokens {
    dt_hf_tokens t;
    int bos_id, eos_id;
    char *eot_text;
    void *held;
} export_tokens;

static dt_status tokens_of(const dt_infer *s, export_tokens *x) {
    memset(x, 0, sizeof *x);
    x->bos_id = x->eos_id = -1;
    if (!s->tok) return DT_OK;
    const int eot = dt_tokenizer_eot(s->tok), cls = s->cfg.model.shape.num_labels > 0;
    size_t len = 0;
    uint32_t id = (uint32_t)eot;
    if (eot >= 0) DT_TRY(dt_tokenizer_decode(s->tok, &id, 1, &x->eot_text, &len));
    char dir[DT_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", dt_tokenizer_name(s->tok));
    DT_TRY(dt_hf_read_tokens(dirname(dir), &x->t, &x->held));
    if (!x->t.eos) { /* no tokenizer_config.json of the model's: the end-of-text token for all */
        x->t.eos = x->eot_text;
        x->t.bos = x->t.unk = NULL;
    }
    x->eos_id = dt_tokenizer_token_id(s->tok, x->t.eos);
    x->bos_id = x->t.bos ? dt_tokenizer_token_id(s->tok, x->t.bos) : x->eos_id;
    /* a classifier pads with the end-of-text token (dtrain's convention: config.json's pad_token_id) */
    x->t.pad = cls ? x->eot_text : x->t.pad;
    return DT_OK;
}

static void tokens_free(export_tokens *x) {
    free(x->eot_text);
    dt_hf_tokens_free(x->held);
}

/* A model without a known tokenizer: data.tokenizer is bytes (the default), but a language
 * model's ids are not bytes (more than 257 of them: it was trained on token shards of another
 * tokenizer). A classifier's texts are bytes and <cls> whatever its vocabulary. */
static int tokenizer_unknown(const dt_config *c) {
    return strcmp(c->data.tokenizer, "bytes") == 0 && c->model.shape.num_labels == 0 && c->model.shape.vocab_size > 257;
}

/* The tokenizer files: the BPE's tokenizer.json as it is (its SHA-256 checked against the run's
 * record when the config was loaded), or the byte tokenizer's made for it. */
static dt_status write_tokenizer(const char *dir, const dt_infer *s, const export_tokens *x) {
    const int T = s->cfg.data.seq_len, cls = s->cfg.model.shape.num_labels > 0;
    if (tokenizer_unknown(&s->cfg)) return DT_OK;
    if (!s->tok) {
        char pad[3];
        dt_tokenizer_byte_string(0, pad); /* the classifier's padding, id 0 */
        DT_TRY(dt_hf_write_byte_tokenizer(dir, cls, T));
        const dt_hf_tokens t = {.pad = cls ? pad : NULL, .cls = cls ? "<cls>" : NULL};
        return dt_hf_write_tokenizer_config(dir, T, &t);
    }
    char path[DT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    DT_TRY(copy_file(dt_tokenizer_name(s->tok), path));
    return dt_hf_write_tokenizer_config(dir, T, &x->t);
}

/* --format peft: adapter_config.json and adapter_model.safetensors, what PEFT's save_pretrained
 * writes for a LoraConfig of the run's model.lora (the classifier's score head as
 * modules_to_save), for peft.PeftModel.from_pretrained(base, dir) over model.init_from's model. */
static dt_status write_peft(const char *dir, dt_infer *s) {
    const dt_config *c = &s->cfg;
    const dt_lora *l = &c->model.lora;
    char path[DT_PATH_MAX + 64];
    json_t *targets = json_array();
    for (int t = 0; t < dt_lora_target_count(); t++)
        if (l->targets & (1u << t)) json_array_append_new(targets, json_string(dt_lora_target_module(t)));
    json_t *o = json_object();
    json_object_set_new(o, "peft_type", json_string("LORA"));
    json_object_set_new(o, "task_type", json_string(c->model.shape.num_labels ? "SEQ_CLS" : "CAUSAL_LM"));
    json_object_set_new(o, "base_model_name_or_path", json_string(c->model.init_from));
    json_object_set_new(o, "r", json_integer(l->rank));
    json_object_set_new(o, "lora_alpha", json_real(l->alpha));
    json_object_set_new(o, "target_modules", targets);
    json_object_set_new(o, "lora_dropout", json_real(0.0));
    json_object_set_new(o, "fan_in_fan_out", json_boolean(c->model.shape.arch == DT_ARCH_GPT2)); /* Conv1D */
    json_object_set_new(o, "bias", json_string("none"));
    json_object_set_new(o, "modules_to_save", c->model.shape.num_labels ? json_pack("[s]", "score") : json_null());
    json_object_set_new(o, "init_lora_weights", json_true());
    json_object_set_new(o, "use_rslora", json_false());
    json_object_set_new(o, "use_dora", json_false());
    json_object_set_new(o, "inference_mode", json_true());
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    DT_TRY(dt_json_write_new(path, o, 17)); /* takes o */
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", dir);
    return dt_model_save_peft(s->model, path);
}

static dt_status write_hf(const char *dir, dt_infer *s) {
    const dt_config *c = &s->cfg;
    const int eot = s->tok ? dt_tokenizer_eot(s->tok) : -1;
    export_tokens x;
    dt_status st = tokens_of(s, &x);
    dt_hf_config hc = {
        .shape = c->model.shape,
        .eos_token_id = s->tok ? x.eos_id : -1, .bos_token_id = s->tok ? x.bos_id : -1,
        /* the id the classifier's padding uses: GPT2ForSequenceClassification then reads the
         * last other token, as dtrain does (bytes: 0 after <cls>; BPE: the end-of-text id) */
        .pad_token_id = c->model.shape.num_labels ? (s->tok ? eot : 0) : -1,
    };
    char path[DT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st == DT_OK) st = dt_model_save_hf(s->model, path);
    if (st == DT_OK) st = dt_hf_write_config(dir, &hc);
    if (st == DT_OK) st = write_tokenizer(dir, s, &x);
    tokens_free(&x);
    return st == DT_OK ? fsync_dir(dir) : st;
}

/* OUT.tmp.PID built whole, then exchanged with OUT (an earlier export, then removed) or renamed
 * onto it: OUT is never missing. */
static dt_status export_dir(dt_infer *s, const char *checkpoint, const char *out_arg,
                            dt_status (*write)(const char *dir, dt_infer *s)) {
    char out[DT_PATH_MAX];
    size_t len = strlen(out_arg);
    while (len > 1 && out_arg[len - 1] == '/') len--; /* "hf/": the directory hf */
    if (len >= sizeof out) return dt_error_set(DT_ERR_USAGE, "--out: a path of at most %d bytes", DT_PATH_MAX - 1);
    memcpy(out, out_arg, len);
    out[len] = '\0';
    DT_TRY(dt_file_check_output("--checkpoint", checkpoint, "--out", out)); /* nothing it reads is replaced */
    DT_TRY(dt_file_check_output("--checkpoint", s->weights, "--out", out));
    if (s->tok) DT_TRY(dt_file_check_output("data.tokenizer", dt_tokenizer_name(s->tok), "--out", out));
    int exists;
    DT_TRY(check_out(out, &exists));
    char tmp[DT_PATH_MAX + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid());
    if (mkdir(tmp, 0755) != 0) return dt_error_set(DT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    dt_status st = write(tmp, s);
    if (st == DT_OK && exists) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, out, RENAME_EXCHANGE) == 0) {
            remove_export(tmp); /* it holds the earlier export now */
        } else { /* a file system without the exchange: the earlier export moves aside first */
            char old[DT_PATH_MAX + 32];
            snprintf(old, sizeof old, "%s.old.%ld", out, (long)getpid());
            if (rename(out, old) != 0)
                st = dt_error_set(DT_ERR_IO, "%s: cannot move aside: %s", out, strerror(errno));
            else if (rename(tmp, out) != 0) {
                st = dt_error_set(DT_ERR_IO, "%s: cannot rename onto %s: %s", tmp, out, strerror(errno));
                rename(old, out);
            } else {
                remove_export(old);
            }
        }
    } else if (st == DT_OK && rename(tmp, out) != 0) {
        st = dt_error_set(DT_ERR_IO, "%s: cannot rename onto %s: %s", tmp, out, strerror(errno));
    }
    if (st != DT_OK) {
        remove_export(tmp);
        return st;
    }
    char parent[DT_PATH_MAX];
    snprintf(parent, sizeof parent, "%s", out);
    return fsync_dir(dirname(parent));
}

static dt_status export_hf(const dt_export_opts *o, dt_export_result *r) { /* and --format peft */
    dt_infer s;
    dt_infer_opts io = {.cmd = "export", .checkpoint = o->checkpoint, .config = o->config, .overrides = o->overrides,
                        .n_overrides = o->n_overrides};
    DT_TRY(dt_infer_resolve(&s, &io));
    s.cfg.training.device = DT_DEVICE_CPU; /* the weights pass through host memory only */
    s.cfg.training.precision = DT_PREC_FP32;
    dt_status st = dt_infer_build(&s.cfg, 0, 0, 1, s.cfg.data.seq_len, 0, &s.be, &s.tok, &s.model);
    int score_loaded = 1;
    if (st == DT_OK) st = dt_infer_load_weights(&s.cfg, s.model, s.weights, &score_loaded);
    if (st == DT_OK && o->peft && !s.cfg.model.lora.rank)
        st = dt_error_set(DT_ERR_USAGE, "export --format peft: %s was not trained with model.lora: there are no "
                          "adapters to export (hint: --format hf)", s.weights);
    if (st == DT_OK && !score_loaded)
        st = dt_error_set(DT_ERR_DATA, "%s: tensor score.weight is missing: the file has no classification head for "
                          "model.num_labels %d", s.weights, s.cfg.model.shape.num_labels);
    if (st == DT_OK) st = export_dir(&s, o->checkpoint, o->out, o->peft ? write_peft : write_hf);
    if (st == DT_OK) { /* as written (model.lora: the adapters merged into the model's tensors, or them alone) */
        char path[DT_PATH_MAX + 64];
        dt_st_file *f;
        snprintf(path, sizeof path, "%s/%s", o->out, o->peft ? "adapter_model.safetensors" : "model.safetensors");
        if ((st = dt_st_open(&f, path)) == DT_OK) {
            r->n_tensors = dt_st_count(f);
            dt_st_close(f);
        }
    }
    r->tokenizer_files = !o->peft && !tokenizer_unknown(&s.cfg);
    if (!o->peft && !r->tokenizer_files)
        snprintf(r->note, sizeof r->note, "no tokenizer files written: data.tokenizer is bytes, but the model's %d ids "
                 "are not bytes (model.vocab_size: %d) (hint: --set data.tokenizer=PATH/tokenizer.json, the tokenizer "
                 "its data was made with)", s.cfg.model.shape.vocab_size, s.cfg.model.shape.vocab_size);
    snprintf(r->weights, sizeof r->weights, "%s", s.weights);
    dt_infer_close(&s);
    return st;
}

dt_status dt_export(const dt_export_opts *o, dt_export_result *r) {
    memset(r, 0, sizeof *r);
    if (o->hf || o->peft) return export_hf(o, r);
    DT_TRY(dt_infer_weights_path(o->checkpoint, stderr, r->weights, sizeof r->weights));
    DT_TRY(dt_file_check_output("--checkpoint", r->weights, "--out", o->out));
    return export_file(r->weights, o->out, &r->n_tensors);
}
