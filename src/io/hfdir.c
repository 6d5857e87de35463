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
    if (json_is_string(j) && dt_arch_from_hf(json_string_value(j), out) == DT_OK) return DT_OK;
    return dt_error_set(DT_ERR_DATA, "%s: model_type is %s%s%s: dtrain builds GPT-2 (model_type \"gpt2\") and Llama-family "
                        "models (\"llama\", \"mistral\", \"qwen2\")", path, json_is_string(j) ? "\"" : "",
                        json_is_string(j) ? json_string_value(j) : "missing", json_is_string(j) ? "\"" : "");
}

/* obj[key] as a number or a boolean for a shape field of that kind (absent or null: *present 0) */
static dt_status get_value(const char *path, json_t *obj, const char *key, const dt_shape_field *f, double *v,
                           int *present) {
    json_t *j = json_object_get(obj, key);
    *present = j != NULL && !json_is_null(j);
    if (!*present) return DT_OK;
    if (f->kind == DT_SHAPE_BOOL) {
        if (!json_is_boolean(j)) return dt_error_set(DT_ERR_DATA, "%s: %s: expected true or false", path, key);
        *v = json_is_true(j);
    } else if (f->kind == DT_SHAPE_DOUBLE) {
        if (!json_is_number(j) || !(json_number_value(j) > 0) || !isfinite(json_number_value(j)))
            return dt_error_set(DT_ERR_DATA, "%s: %s: expected a positive number", path, key);
        *v = json_number_value(j);
    } else {
        int i = 0;
        DT_TRY(get_int(path, obj, key, &i, NULL));
        *v = i;
    }
    return DT_OK;
}

/* The shape fields config.json names for the architecture (arch.h): the ones every
 * architecture has are required (GPT-2's n_positions may be written n_ctx); an
 * architecture's own keep their defaults where config.json lacks them, as transformers'
 * config classes do (the Llama family's key/value heads: the query heads; head_dim:
 * hidden_size / num_attention_heads). */
static dt_status read_shape(const char *path, json_t *root, dt_model_shape *shape) {
    int nf;
    const dt_shape_field *f = dt_shape_fields(&nf);
    for (int k = 0; k < nf; k++) {
        const char *key = f[k].hf[shape->arch];
        double v = dt_shape_default(&f[k]);
        if (!key || strchr(key, '.')) { /* none, or rope_scaling's (read_rope_scaling) */
            dt_shape_set(shape, &f[k], v);
            continue;
        }
        int present = 0, required = f[k].archs == DT_ARCHS_ALL;
        if (required && f[k].kind == DT_SHAPE_INT) {
            int i = 0;
            DT_TRY(get_required(path, root, key, strcmp(key, "n_positions") == 0 ? "n_ctx" : NULL, &i));
            v = i;
        } else {
            DT_TRY(get_value(path, root, key, &f[k], &v, &present));
        }
        dt_shape_set(shape, &f[k], v);
    }
    if (shape->arch == DT_ARCH_LLAMA) {
        shape->num_key_value_heads = dt_shape_kv_heads(shape);
        shape->head_dim = dt_shape_head_dim(shape);
        if (shape->num_key_value_heads > shape->n_head || shape->n_head % shape->num_key_value_heads != 0)
            return dt_error_set(DT_ERR_DATA, "%s: num_key_value_heads: %d does not divide num_attention_heads: %d (each "
                                "key/value head serves a group of query heads)", path, shape->num_key_value_heads,
                                shape->n_head);
    }
    return DT_OK;
}

/* What dtrain's Llama does not have: refused, naming the key. */
static dt_status check_llama(const char *path, json_t *root) {
    json_t *j = json_object_get(root, "hidden_act");
    if (j && !(json_is_string(j) && strcmp(json_string_value(j), "silu") == 0))
        return dt_error_set(DT_ERR_DATA, "%s: hidden_act is %s: dtrain's Llama MLP is SwiGLU (silu)", path,
                            json_is_string(j) ? json_string_value(j) : "not a string");
    if (json_is_true(json_object_get(root, "mlp_bias")))
        return dt_error_set(DT_ERR_DATA, "%s: mlp_bias is true: dtrain's Llama MLP has no biases", path);
    j = json_object_get(root, "sliding_window");
    json_t *use = json_object_get(root, "use_sliding_window");
    if (j && !json_is_null(j) && !json_is_false(use))
        return dt_error_set(DT_ERR_DATA, "%s: sliding_window is set: dtrain's attention sees every earlier position "
                            "(sliding-window attention is not built)", path);
    j = json_object_get(root, "pretraining_tp");
    if (j && !(json_is_integer(j) && json_integer_value(j) == 1))
        return dt_error_set(DT_ERR_DATA, "%s: pretraining_tp: expected 1", path);
    return DT_OK;
}

/* obj.key (named where.key) a number > min (>= min when !open) into *v */
static dt_status get_scaling(const char *path, const char *where, json_t *obj, const char *key, double min, int open,
                             double *v) {
    json_t *j = json_object_get(obj, key);
    const double x = json_is_number(j) ? json_number_value(j) : NAN;
    if (!isfinite(x) || (open ? !(x > min) : !(x >= min)))
        return dt_error_set(DT_ERR_DATA, "%s: %s.%s: expected a number %s %g (rope_type \"llama3\" needs factor, "
                            "low_freq_factor, high_freq_factor and original_max_position_embeddings)%s", path, where,
                            key, open ? ">" : ">=", min, j ? "" : ", but the key is missing");
    *v = x;
    return DT_OK;
}

/* One rope_scaling object (transformers 4's rope_scaling, or 5's rope_parameters, `where`):
 * rope_type (or the older "type") "default" is none, "llama3" Llama 3.1's frequencies, read
 * into shape; any other is refused naming it. */
static dt_status read_scaling(const char *path, const char *where, json_t *o, dt_model_shape *shape) {
    if (!json_is_object(o)) return dt_error_set(DT_ERR_DATA, "%s: %s: expected an object or null", path, where);
    json_t *type = json_object_get(o, "rope_type");
    if (!type) type = json_object_get(o, "type");
    const char *t = json_is_string(type) ? json_string_value(type) : type ? NULL : "default";
    if (t && strcmp(t, "default") == 0) return DT_OK;
    if (!t || strcmp(t, "llama3") != 0)
        return dt_error_set(DT_ERR_DATA, "%s: %s: rope_type %s%s%s: dtrain builds RoPE unscaled (\"default\") or scaled "
                            "as Llama 3.1 (\"llama3\")", path, where, t ? "\"" : "", t ? t : "(not a string)",
                            t ? "\"" : "");
    double orig;
    DT_TRY(get_scaling(path, where, o, "factor", 1, 0, &shape->rope_scaling_factor));
    DT_TRY(get_scaling(path, where, o, "low_freq_factor", 0, 1, &shape->rope_low_freq_factor));
    DT_TRY(get_scaling(path, where, o, "high_freq_factor", shape->rope_low_freq_factor, 1, &shape->rope_high_freq_factor));
    DT_TRY(get_scaling(path, where, o, "original_max_position_embeddings", 1, 0, &orig));
    if (orig != floor(orig) || orig > 1 << 30)
        return dt_error_set(DT_ERR_DATA, "%s: %s.original_max_position_embeddings: expected an integer", path, where);
    shape->rope_original_max_position_embeddings = (int)orig;
    return DT_OK;
}

/* RoPE's scaling: rope_scaling, or transformers 5's rope_parameters (both: they must agree) */
static dt_status read_rope_scaling(const char *path, json_t *root, dt_model_shape *shape) {
    json_t *rs = json_object_get(root, "rope_scaling"), *rp = json_object_get(root, "rope_parameters");
    if (rs && !json_is_null(rs)) DT_TRY(read_scaling(path, "rope_scaling", rs, shape));
    if (!rp || json_is_null(rp)) return DT_OK;
    dt_model_shape v5 = *shape;
    v5.rope_scaling_factor = 0;
    DT_TRY(read_scaling(path, "rope_parameters", rp, &v5));
    if (rs && !json_is_null(rs) &&
        (v5.rope_scaling_factor != shape->rope_scaling_factor || v5.rope_low_freq_factor != shape->rope_low_freq_factor ||
         v5.rope_high_freq_factor != shape->rope_high_freq_factor ||
         v5.rope_original_max_position_embeddings != shape->rope_original_max_position_embeddings))
        return dt_error_set(DT_ERR_DATA, "%s: rope_scaling and rope_parameters differ", path);
    *shape = v5;
    return DT_OK;
}

/* rope_theta where transformers 5 writes it: rope_parameters.rope_theta */
static dt_status read_rope_parameters(const char *path, json_t *root, dt_model_shape *shape) {
    DT_TRY(read_rope_scaling(path, root, shape));
    json_t *theta = json_object_get(json_object_get(root, "rope_parameters"), "rope_theta");
    if (!theta) return DT_OK;
    if (!json_is_number(theta) || !(json_number_value(theta) > 0) || !isfinite(json_number_value(theta)))
        return dt_error_set(DT_ERR_DATA, "%s: rope_parameters.rope_theta: expected a positive number", path);
    if (json_object_get(root, "rope_theta") && json_number_value(json_object_get(root, "rope_theta")) != json_number_value(theta))
        return dt_error_set(DT_ERR_DATA, "%s: rope_theta and rope_parameters.rope_theta differ", path);
    shape->rope_theta = json_number_value(theta);
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

/* DIR's optional tokenizer_config.json into *out (NULL when it is not there, or does not parse:
 * hub files hold sentinels past jansson's integers, model_max_length 1e30 written out); a FIFO
 * or a device there is an error naming it, never a hang. */
static dt_status read_optional(const char *path, json_t **out) {
    *out = NULL;
    if (access(path, F_OK) != 0) return DT_OK;
    int fd;
    DT_TRY(dt_file_open_regular(path, DT_ERR_DATA, &fd));
    *out = json_loadfd(fd, 0, NULL);
    close(fd);
    return DT_OK;
}

dt_status dt_hf_read_config(const char *dir, dt_hf_config *out) {
    char path[HF_PATH_MAX];
    snprintf(path, sizeof path, "%s/config.json", dir);
    memset(out, 0, sizeof *out);
    out->pad_token_id = out->eos_token_id = out->bos_token_id = -1;
    json_t *root;
    DT_TRY(dt_json_read(path, JSON_REJECT_DUPLICATES, &root));
    dt_status st = json_is_object(root) ? DT_OK : dt_error_set(DT_ERR_DATA, "%s: expected a JSON object", path);
    if (st == DT_OK) st = read_arch(path, root, &out->shape.arch);
    if (st == DT_OK) st = read_shape(path, root, &out->shape);
    if (st == DT_OK && strcmp(json_string_value(json_object_get(root, "model_type")), "qwen2") == 0) {
        out->shape.qkv_bias = 1; /* Qwen2Attention: q, k and v with biases, o without; no attention_bias key */
        out->shape.attention_bias = 0;
    }
    if (st == DT_OK)
        st = out->shape.arch == DT_ARCH_GPT2 ? check_gpt2(path, root, out->shape.n_embd) : check_llama(path, root);
    if (st == DT_OK && out->shape.arch == DT_ARCH_LLAMA) st = read_rope_parameters(path, root, &out->shape);
    if (st == DT_OK) st = read_labels(path, root, &out->shape.num_labels);
    if (st == DT_OK) st = get_int(path, root, "pad_token_id", &out->pad_token_id, NULL);
    if (st == DT_OK) st = get_int(path, root, "eos_token_id", &out->eos_token_id, NULL);
    if (st == DT_OK) st = get_int(path, root, "bos_token_id", &out->bos_token_id, NULL);
    json_decref(root);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *tc = NULL;
    if (st == DT_OK) st = read_optional(path, &tc);
    json_t *ml = json_object_get(tc, "model_max_length");
    if (json_is_integer(ml) && json_integer_value(ml) > 1 && json_integer_value(ml) <= out->shape.n_positions)
        out->max_length = (int)json_integer_value(ml);
    json_decref(tc);
    return st;
}

/* ---- writing ---- */

/* The significant digits every real of j needs to read back exactly (at most 17). */
static int real_digits(json_t *j) {
    int most = 1;
    if (json_is_real(j)) {
        const double v = json_real_value(j);
        char buf[40];
        for (; most < 17; most++) {
            snprintf(buf, sizeof buf, "%.*g", most, v);
            if (strtod(buf, NULL) == v) break;
        }
    } else if (json_is_object(j) || json_is_array(j)) {
        const char *k;
        json_t *v;
        size_t i;
        if (json_is_object(j)) json_object_foreach(j, k, v) most = real_digits(v) > most ? real_digits(v) : most;
        else json_array_foreach(j, i, v) most = real_digits(v) > most ? real_digits(v) : most;
    }
    return most;
}

/* obj (consumed) into the new file DIR/name: reals with 10 significant digits (1e-05, 0.02: as
 * transformers writes them), or as many as one needs to read back exactly */
static dt_status write_json(const char *dir, const char *name, json_t *obj) {
    char path[HF_PATH_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    const int digits = obj ? real_digits(obj) : 10;
    return dt_json_write_new(path, obj, digits > 10 ? digits : 10);
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

/* GPT-2's keys beyond its shape: the variant dtrain builds, no dropout */
static void gpt2_keys(json_t *o) {
    json_object_set_new(o, "n_inner", json_null());
    json_object_set_new(o, "activation_function", json_string("gelu_new"));
    json_object_set_new(o, "layer_norm_epsilon", json_real(1e-5));
    static const char *const dropouts[] = {"resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"};
    for (size_t i = 0; i < sizeof dropouts / sizeof *dropouts; i++) json_object_set_new(o, dropouts[i], json_real(0.0));
    json_object_set_new(o, "scale_attn_weights", json_true());
    json_object_set_new(o, "tie_word_embeddings", json_true());
}

/* Qwen 2's config.json: q, k and v with biases, o without (a Llama with qkv_bias) */
static int is_qwen2(const dt_model_shape *sh) {
    return sh->arch == DT_ARCH_LLAMA && sh->qkv_bias && !sh->attention_bias;
}

/* the Llama family's keys beyond its shape */
static void llama_keys(json_t *o, const dt_model_shape *sh) {
    json_object_set_new(o, "hidden_act", json_string("silu"));
    json_object_set_new(o, "mlp_bias", json_false());
    json_object_set_new(o, "rope_scaling", sh->rope_scaling_factor > 0
                                               ? json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor",
                                                           sh->rope_scaling_factor, "low_freq_factor",
                                                           sh->rope_low_freq_factor, "high_freq_factor",
                                                           sh->rope_high_freq_factor, "original_max_position_embeddings",
                                                           sh->rope_original_max_position_embeddings)
                                               : json_null());
    if (is_qwen2(sh)) { /* Qwen2Config's sliding window, off */
        json_object_set_new(o, "use_sliding_window", json_false());
        json_object_set_new(o, "sliding_window", json_null());
        json_object_set_new(o, "max_window_layers", json_integer(sh->n_layer));
    }
    json_object_set_new(o, "attention_dropout", json_real(0.0));
    json_object_set_new(o, "pretraining_tp", json_integer(1));
}

dt_status dt_hf_write_config(const char *dir, const dt_hf_config *c) {
    json_t *o = json_object();
    if (!o) return dt_error_set(DT_ERR_NOMEM, "out of memory building config.json");
    dt_model_shape sh = c->shape;
    if (sh.arch == DT_ARCH_LLAMA) { /* written resolved */
        sh.num_key_value_heads = dt_shape_kv_heads(&sh);
        sh.head_dim = dt_shape_head_dim(&sh);
    }
    const int qwen2 = is_qwen2(&sh);
    json_object_set_new(o, "architectures",
                        json_pack("[s]", qwen2 ? (sh.num_labels ? "Qwen2ForSequenceClassification" : "Qwen2ForCausalLM")
                                               : dt_arch_hf_class(sh.arch, sh.num_labels > 0)));
    json_object_set_new(o, "model_type", json_string(qwen2 ? "qwen2" : dt_arch_hf_model_type(sh.arch)));
    int nf;
    const dt_shape_field *f = dt_shape_fields(&nf);
    for (int k = 0; k < nf; k++) {
        const char *key = f[k].hf[sh.arch];
        const double v = dt_shape_get(&sh, &f[k]);
        if (!key || strchr(key, '.')) continue; /* rope_scaling's: llama_keys */
        json_object_set_new(o, key, f[k].kind == DT_SHAPE_BOOL     ? json_boolean(v != 0)
                                    : f[k].kind == DT_SHAPE_DOUBLE ? json_real(v)
                                                                   : json_integer((json_int_t)v));
    }
    if (sh.arch == DT_ARCH_GPT2) gpt2_keys(o);
    else llama_keys(o, &sh);
    json_object_set_new(o, "initializer_range", json_real(0.02));
    json_object_set_new(o, "use_cache", json_true());
    /* null when there is none: GPT2Config's default (50256) would name a token of GPT-2's own */
    const int bos = c->bos_token_id >= 0 ? c->bos_token_id : c->eos_token_id;
    json_object_set_new(o, "bos_token_id", bos >= 0 ? json_integer(bos) : json_null());
    json_object_set_new(o, "eos_token_id", c->eos_token_id >= 0 ? json_integer(c->eos_token_id) : json_null());
    if (c->pad_token_id >= 0) json_object_set_new(o, "pad_token_id", json_integer(c->pad_token_id));
    if (sh.num_labels) {
        json_object_set_new(o, "id2label", labels_map(sh.num_labels, 1));
        json_object_set_new(o, "label2id", labels_map(sh.num_labels, 0));
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

/* The tokenizer.json of dtrain's byte tokenizer (dt_hf_write_byte_tokenizer); NULL when out of memory. */
static json_t *byte_tokenizer_json(int with_cls, int max_length) {
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
    return o;
}

dt_status dt_hf_write_byte_tokenizer(const char *dir, int with_cls, int max_length) {
    return write_json(dir, "tokenizer.json", byte_tokenizer_json(with_cls, max_length));
}

int dt_hf_is_byte_tokenizer(const char *path) {
    json_t *root; /* a FIFO or a file that does not parse: not bytes (the BPE reader then says what it is) */
    if (dt_json_read(path, 0, &root) != DT_OK) return 0;
    json_t *trunc = json_object_get(root, "truncation"), *added = json_object_get(root, "added_tokens");
    const int with_cls = json_array_size(added) > 0;
    const json_int_t T = json_integer_value(json_object_get(trunc, "max_length"));
    json_t *want = byte_tokenizer_json(with_cls, with_cls && T > 0 && T <= 1 << 30 ? (int)T : 0);
    const int yes = want && json_equal(root, want); /* exactly what export writes, but for the layout */
    json_decref(want);
    json_decref(root);
    return yes;
}

dt_status dt_hf_write_tokenizer_config(const char *dir, int max_length, const dt_hf_tokens *t) {
    json_t *o = json_pack("{s:s, s:i, s:b}", "tokenizer_class", "PreTrainedTokenizerFast", "model_max_length",
                          max_length, "clean_up_tokenization_spaces", 0);
    const char *bos = t->bos ? t->bos : t->eos, *unk = t->unk ? t->unk : t->eos;
    if (o && bos) json_object_set_new(o, "bos_token", json_string(bos));
    if (o && t->eos) json_object_set_new(o, "eos_token", json_string(t->eos));
    if (o && unk) json_object_set_new(o, "unk_token", json_string(unk));
    if (o && t->pad) json_object_set_new(o, "pad_token", json_string(t->pad));
    if (o && t->cls) json_object_set_new(o, "cls_token", json_string(t->cls));
    if (o && t->chat_template) json_object_set_new(o, "chat_template", json_string(t->chat_template));
    return write_json(dir, "tokenizer_config.json", o);
}

/* a special token's text: "<|im_end|>" or {"content": "<|im_end|>", ...} */
static const char *token_text(json_t *j) {
    return json_is_string(j) ? json_string_value(j) : json_string_value(json_object_get(j, "content"));
}

dt_status dt_hf_read_tokens(const char *dir, dt_hf_tokens *t, void **held) {
    memset(t, 0, sizeof *t);
    *held = NULL;
    char path[HF_PATH_MAX];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (access(path, F_OK) != 0) return DT_OK;
    json_t *root;
    DT_TRY(dt_json_read(path, 0, &root));
    if (!json_is_object(root)) {
        json_decref(root);
        return dt_error_set(DT_ERR_DATA, "%s: not a JSON object", path);
    }
    t->bos = token_text(json_object_get(root, "bos_token"));
    t->eos = token_text(json_object_get(root, "eos_token"));
    t->unk = token_text(json_object_get(root, "unk_token"));
    t->pad = token_text(json_object_get(root, "pad_token"));
    t->chat_template = json_string_value(json_object_get(root, "chat_template"));
    *held = root;
    return DT_OK;
}

void dt_hf_tokens_free(void *held) { json_decref(held); }

/* target_modules' entry `name` as architecture a's targets: the DT_LORA_TARGETS rows whose module
 * path is name or ends with "." name, as PEFT matches them (GPT-2's "c_proj": both) */
static unsigned adapter_targets(dt_arch a, const char *name) {
    const unsigned have = dt_lora_arch_targets(a);
    unsigned m = 0;
    for (int t = 0; t < dt_lora_target_count(); t++) {
        if (!(have & (1u << t))) continue;
        const char *mod = dt_lora_target_module(t);
        const size_t n = strlen(name), k = strlen(mod);
        if (strcmp(mod, name) == 0 || (k > n && mod[k - n - 1] == '.' && strcmp(mod + k - n, name) == 0)) m |= 1u << t;
    }
    return m;
}

dt_status dt_hf_read_adapter_config(const char *dir, dt_arch a, dt_lora *out) {
    char path[HF_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    json_t *root;
    DT_TRY(dt_json_read(path, JSON_REJECT_DUPLICATES, &root));
    dt_status st = DT_OK;
    json_t *type = json_object_get(root, "peft_type"), *r = json_object_get(root, "r"),
           *alpha = json_object_get(root, "lora_alpha"), *tm = json_object_get(root, "target_modules");
    const char *bad = NULL;
    if (!json_is_string(type) || strcmp(json_string_value(type), "LORA") != 0) bad = "peft_type: expected \"LORA\"";
    else if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > 4096)
        bad = "r: expected an integer in [1, 4096]";
    else if (!json_is_number(alpha) || !(json_number_value(alpha) > 0)) bad = "lora_alpha: expected a number > 0";
    else if (!json_is_array(tm) || json_array_size(tm) == 0)
        bad = "target_modules: expected a list of module names (a regular expression is not read)";
    else if (json_is_true(json_object_get(root, "use_dora"))) bad = "use_dora: dtrain's adapters are plain LoRA";
    else if (json_is_true(json_object_get(root, "use_rslora"))) bad = "use_rslora: dtrain scales by lora_alpha / r";
    else {
        const char *pat[] = {"rank_pattern", "alpha_pattern"};
        for (int i = 0; i < 2 && !bad; i++) {
            json_t *p = json_object_get(root, pat[i]);
            if (p && !json_is_null(p) && !(json_is_object(p) && json_object_size(p) == 0))
                bad = i ? "alpha_pattern: dtrain gives every adapter the same alpha" : "rank_pattern: dtrain gives every "
                          "adapter the same rank";
        }
    }
    if (bad) {
        st = dt_error_set(DT_ERR_DATA, "%s: %s", path, bad);
        goto done;
    }
    memset(out, 0, sizeof *out);
    out->rank = (int)json_integer_value(r);
    out->alpha = json_number_value(alpha);
    for (size_t i = 0; i < json_array_size(tm); i++) {
        const char *name = json_string_value(json_array_get(tm, i));
        const unsigned t = name ? adapter_targets(a, name) : 0;
        if (!t) {
            char valid[256];
            st = dt_error_set(DT_ERR_DATA, "%s: target_modules[%zu]: %s%s%s is not a projection dtrain adapts in model.type "
                              "%s (%s)", path, i, name ? "\"" : "", name ? name : "not a string", name ? "\"" : "",
                              dt_arch_name(a), dt_lora_targets_str(dt_lora_arch_targets(a), valid, sizeof valid));
            goto done;
        }
        out->targets |= t;
    }
done:
    json_decref(root);
    return st;
}
