/* hfdir.c — Hugging Face model directories: config.json read and written, the byte
 * tokenizer as a tokenizer.json (include/dtrain/hfdir.h). */
#include "dtrain/hfdir.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/file.h"
#include "dtrain/jsonfile.h"
#include "dtrain/tokenizer.h"

#define HF_PATH_MAX 4200

int dt_hf_is_dir(const char *path) {
    struct stat sb;
    char p[HF_PATH_MAX];
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) return 0;
    snprintf(p, sizeof p, "%s/config.json", path);
    return access(p, F_OK) == 0;
}

/* ---- reading ---- */

/* obj[key] as an int: *v (unchanged when absent, *present 0). DT_ERR_DATA when it is not an integer. */
static dt_status get_int(const char *path, json_t *obj, const char *key, int *v, int *present) {
    json_t *j = json_object_get(obj, key);
    if (present) *present = j != NULL && !json_is_null(j);
    if (!j || json_is_null(j)) return DT_OK;
    if (!json_is_integer(j) || json_integer_value(j) < 0 || json_integer_value(j) > 1 << 30)
        return dt_error_set(DT_ERR_DATA, "%s: %s: expected a non-negative integer", path, key);
    *v = (int)json_integer_value(j);
    return DT_OK;
}

static dt_status get_required(const char *path, json_t *obj, const char *key, const char *alt, int *v) {
    int present = 0;
    DT_TRY(get_int(path, obj, key, v, &present));
    if (!present && alt) DT_TRY(get_int(path, obj, alt, v, &present));
    if (!present || *v <= 0)
        return dt_error_set(DT_ERR_DATA, "%s: %s: expected a positive integer%s", path, key,
                            present ? "" : ", but the key is missing");
    return DT_OK;
}

/* model_type: one of the architectures of arch.h */
static dt_status read_arch(const char *path, json_t *root, dt_arch *out) {
    json_t *j = json_object_get(root, "model_type");
    for (int a = 0; json_is_string(j) && a < DT_ARCH_COUNT; a++)
        if (strcmp(json_string_value(j), dt_arch_hf_model_type((dt_arch)a)) == 0) {
            *out = (dt_arch)a;
            return DT_OK;
        }
    return dt_error_set(DT_ERR_DATA, "%s: model_type is %s%s%s: dtrain builds GPT-2 models (model_type \"gpt2\")", path,
                        json_is_string(j) ? "\"" : "", json_is_string(j) ? json_string_value(j) : "missing",
                        json_is_string(j) ? "\"" : "");
}

/* The shape fields config.json names for the architecture (arch.h); GPT-2's n_positions may be
 * written n_ctx. */
static dt_status read_shape(const char *path, json_t *root, dt_model_shape *shape) {
    int nf;
    const dt_shape_field *f = dt_shape_fields(&nf);
    for (int k = 0; k < nf; k++) {
        const char *key = f[k].hf[shape->arch];
        if (!key) continue;
        int v = 0;
        DT_TRY(get_required(path, root, key, strcmp(key, "n_positions") == 0 ? "n_ctx" : NULL, &v));
        dt_shape_set(shape, &f[k], v);
    }
    return DT_OK;
}

/* What dtrain's GPT-2 does not have: refused, naming the key. */
static dt_status check_gpt2(const char *path, json_t *root, int n_embd) {
    json_t *j = json_object_get(root, "activation_function");
    if (j && !(json_is_string(j) && (strcmp(json_string_value(j), "gelu_new") == 0 ||
                                     strcmp(json_string_value(j), "gelu_pytorch_tanh") == 0)))
        return dt_error_set(DT_ERR_DATA, "%s: activation_function is %s: dtrain's GELU is the tanh form (gelu_new)", path,
                            json_is_string(j) ? json_string_value(j) : "not a string");
    j = json_object_get(root, "layer_norm_epsilon");
    if (j && !(json_is_number(j) && fabs(json_number_value(j) - 1e-5) <= 1e-12))
        return dt_error_set(DT_ERR_DATA, "%s: layer_norm_epsilon: dtrain's LayerNorm uses 1e-05", path);
    int n_inner = 4 * n_embd;
    DT_TRY(get_int(path, root, "n_inner", &n_inner, NULL));
    if (n_inner != 4 * n_embd)
        return dt_error_set(DT_ERR_DATA, "%s: n_inner is %d: dtrain's MLP is 4 * n_embd (%d) wide", path, n_inner,
                            4 * n_embd);
    static const char *const must_be_false[] = {"add_cross_attention", "scale_attn_by_inverse_layer_idx"};
    for (size_t i = 0; i < sizeof must_be_false / sizeof *must_be_false; i++)
        if (json_is_true(json_object_get(root, must_be_false[i])))
            return dt_error_set(DT_ERR_DATA, "%s: %s is true: dtrain's GPT-2 has no such option", path, must_be_false[i]);
    if (json_is_false(json_object_get(root, "scale_attn_weights")))
        return dt_error_set(DT_ERR_DATA, "%s: scale_attn_weights is false: dtrain always scales attention by "
                            "1/sqrt(head size)", path);
    return DT_OK;
}

/* num_labels of a GPT2ForSequenceClassification (its id2label, else num_labels, else 2); 0 otherwise */
static dt_status read_labels(const char *path, json_t *root, int *out) {
    *out = 0;
    json_t *arch = json_object_get(root, "architectures");
    int classifier = 0;
    for (size_t i = 0; i < json_array_size(arch); i++) {
        const char *a = json_string_value(json_array_get(arch, i));
        if (a && strstr(a, "ForSequenceClassification")) classifier = 1;
    }
    if (!classifier) return DT_OK;
    json_t *ids = json_object_get(root, "id2label");
    *out = json_is_object(ids) ? (int)json_object_size(ids) : 2;
    if (!json_is_object(ids)) DT_TRY(get_int(path, root, "num_labels", out, NULL));
    return DT_OK;
}

dt_status dt_hf_read_config(const char *dir, dt_hf_config *out) {
    char path[HF_PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    memset(out, 0, sizeof *out);
    out->pad_token_id = out->eos_token_id = -1;
    int fd;
    DT_TRY(dt_file_open_regular(path, DT_ERR_DATA, &fd));
    json_error_t err;
    json_t *root = json_loadfd(fd, JSON_REJECT_DUPLICATES, &err);
    close(fd);
    if (!root) return dt_error_set(DT_ERR_DATA, "%s:%d: not JSON: %s", path, err.line, err.text);
    dt_status st = json_is_object(root) ? DT_OK : dt_error_set(DT_ERR_DATA, "%s: expected a JSON object", path);
    if (st == DT_OK) st = read_arch(path, root, &out->shape.arch);
    if (st == DT_OK) st = read_shape(path, root, &out->shape);
    if (st == DT_OK) st = check_gpt2(path, root, out->shape.n_embd);
    if (st == DT_OK) st = read_labels(path, root, &out->shape.num_labels);
    if (st == DT_OK) st = get_int(path, root, "pad_token_id", &out->pad_token_id, NULL);
    if (st == DT_OK) st = get_int(path, root, "eos_token_id", &out->eos_token_id, NULL);
    json_decref(root);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *tc = st == DT_OK ? json_load_file(path, 0, NULL) : NULL; /* optional: hub files hold huge sentinels */
    json_t *ml = json_object_get(tc, "model_max_length");
    if (json_is_integer(ml) && json_integer_value(ml) > 1 && json_integer_value(ml) <= out->shape.n_positions)
        out->max_length = (int)json_integer_value(ml);
    json_decref(tc);
    return st;
}

int dt_hf_is_byte_tokenizer(const char *path) {
    json_t *root = json_load_file(path, 0, NULL);
    json_t *model = json_object_get(root, "model"), *vocab = json_object_get(model, "vocab");
    int yes = json_is_string(json_object_get(model, "type")) &&
              strcmp(json_string_value(json_object_get(model, "type")), "BPE") == 0 &&
              json_array_size(json_object_get(model, "merges")) == 0 && json_object_size(vocab) == 256;
    char ch[3];
    for (unsigned b = 0; yes && b < 256; b++) {
        dt_tokenizer_byte_string(b, ch);
        json_t *id = json_object_get(vocab, ch);
        yes = json_is_integer(id) && json_integer_value(id) == (json_int_t)b;
    }
    json_decref(root);
    return yes;
}

/* ---- writing ---- */

/* obj (consumed) into the new file DIR/name */
static dt_status write_json(const char *dir, const char *name, json_t *obj) {
    char path[HF_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return dt_json_write_new(path, obj, 10); /* 1e-05, 0.02: as transformers writes them */
}

static json_t *labels_map(int n, int by_id) {
    json_t *m = json_object();
    char id[16], name[32];
    for (int i = 0; m && i < n; i++) {
        snprintf(id, sizeof id, "%d", i);
        snprintf(name, sizeof name, "LABEL_%d", i);
        json_object_set_new(m, by_id ? id : name, by_id ? json_string(name) : json_integer(i));
    }
    return m;
}

dt_status dt_hf_write_config(const char *dir, const dt_hf_config *c) {
    json_t *o = json_object();
    if (!o) return dt_error_set(DT_ERR_NOMEM, "out of memory building config.json");
    const dt_model_shape *sh = &c->shape;
    json_object_set_new(o, "architectures", json_pack("[s]", dt_arch_hf_class(sh->arch, sh->num_labels > 0)));
    json_object_set_new(o, "model_type", json_string(dt_arch_hf_model_type(sh->arch)));
    int nf;
    const dt_shape_field *f = dt_shape_fields(&nf);
    for (int k = 0; k < nf; k++)
        if (f[k].hf[sh->arch]) json_object_set_new(o, f[k].hf[sh->arch], json_integer((json_int_t)dt_shape_get(sh, &f[k])));
    json_object_set_new(o, "n_inner", json_null());
    json_object_set_new(o, "activation_function", json_string("gelu_new"));
    json_object_set_new(o, "layer_norm_epsilon", json_real(1e-5));
    static const char *const dropouts[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"};
    for (size_t i = 0; i < sizeof dropouts / sizeof *dropouts; i++) json_object_set_new(o, dropouts[i], json_real(0.0));
    json_object_set_new(o, "initializer_range", json_real(0.02));
    json_object_set_new(o, "scale_attn_weights", json_true());
    json_object_set_new(o, "tie_word_embeddings", json_true());
    json_object_set_new(o, "use_cache", json_true());
    /* null when there is none: GPT2Config's default (50256) would name a token of GPT-2's own */
    json_object_set_new(o, "bos_token_id", c->eos_token_id >= 0 ? json_integer(c->eos_token_id) : json_null());
    json_object_set_new(o, "eos_token_id", c->eos_token_id >= 0 ? json_integer(c->eos_token_id) : json_null());
    if (c->pad_token_id >= 0) json_object_set_new(o, "pad_token_id", json_integer(c->pad_token_id));
    if (sh->num_labels) {
        json_object_set_new(o, "id2label", labels_map(sh->num_labels, 1));
        json_object_set_new(o, "label2id", labels_map(sh->num_labels, 0));
        json_object_set_new(o, "problem_type", json_string("single_label_classification"));
    }
    json_object_set_new(o, "dtype", json_string("float32"));
    return write_json(dir, "config.json", o);
}

static json_t *added_token(int id, const char *content) {
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content, "single_word", 0, "lstrip", 0,
                     "rstrip", 0, "normalized", 0, "special", 1);
}

/* "$A <cls>" (and "$A $B <cls>" for pairs) */
static json_t *cls_template(void) {
    return json_pack("{s:s, s:[{s:{s:s,s:i}}, {s:{s:s,s:i}}], s:[{s:{s:s,s:i}}, {s:{s:s,s:i}}, {s:{s:s,s:i}}],"
                     " s:{s:{s:s, s:[i], s:[s]}}}",
                     "type", "TemplateProcessing",
                     "single", "Sequence", "id", "A", "type_id", 0, "SpecialToken", "id", "<cls>", "type_id", 0,
                     "pair", "Sequence", "id", "A", "type_id", 0, "Sequence", "id", "B", "type_id", 1, "SpecialToken",
                     "id", "<cls>", "type_id", 0,
                     "special_tokens", "<cls>", "id", "<cls>", "ids", 256, "tokens", "<cls>");
}

dt_status dt_hf_write_byte_tokenizer(const char *dir, int with_cls, int max_length) {
    json_t *vocab = json_object();
    char ch[3];
    for (unsigned b = 0; vocab && b < 256; b++) {
        dt_tokenizer_byte_string(b, ch);
        json_object_set_new(vocab, ch, json_integer((json_int_t)b));
    }
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:[]}", "type", "BPE", "dropout",
                              "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                              "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges");
    json_t *bytelevel = json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                                  "use_regex", 1);
    json_t *o = json_pack("{s:s, s:n, s:n, s:[], s:n, s:O, s:n, s:o, s:o}", "version", "1.0", "truncation", "padding",
                          "added_tokens", "normalizer", "pre_tokenizer", bytelevel, "post_processor", "decoder",
                          bytelevel, "model", model);
    /* bytelevel: s:O took a reference of its own, s:o the caller's: o holds both */
    if (o && with_cls) {
        json_array_append_new(json_object_get(o, "added_tokens"), added_token(256, "<cls>"));
        json_object_set_new(o, "post_processor", cls_template());
        json_object_set_new(o, "truncation", json_pack("{s:s, s:i, s:s, s:i}", "direction", "Right", "max_length",
                                                       max_length, "strategy", "LongestFirst", "stride", 0));
    }
    return write_json(dir, "tokenizer.json", o);
}

dt_status dt_hf_write_tokenizer_config(const char *dir, int max_length, const char *eos, const char *pad,
                                       const char *cls) {
    json_t *o = json_pack("{s:s, s:i, s:b}", "tokenizer_class", "PreTrainedTokenizerFast", "model_max_length",
                          max_length, "clean_up_tokenization_spaces", 0);
    if (o && eos) {
        json_object_set_new(o, "bos_token", json_string(eos));
        json_object_set_new(o, "eos_token", json_string(eos));
        json_object_set_new(o, "unk_token", json_string(eos));
    }
    if (o && pad) json_object_set_new(o, "pad_token", json_string(pad));
    if (o && cls) json_object_set_new(o, "cls_token", json_string(cls));
    return write_json(dir, "tokenizer_config.json", o);
}
