/* arch.h — the architectures dtrain builds, as data: their names (model.type), the model's
 * shape fields (one table that the config, Hugging Face directories, checkpoints and the model
 * all read), and each architecture's names for them in a Hugging Face config.json.
 *
 * What an architecture computes (its tensors, their Hugging Face names, its layer) is the
 * model's business (src/model/net.h); this module holds only what the layers below the model
 * need to read and write a model's description. */
#ifndef DTRAIN_ARCH_H
#define DTRAIN_ARCH_H

#include <stddef.h>
#include <stdio.h>

#include "dtrain/status.h"

typedef enum { DT_ARCH_GPT2 = 0, DT_ARCH_LLAMA, DT_ARCH_COUNT } dt_arch;

/* model.type's spellings: X(spelling, architecture, a number of its own). The config keeps
 * the spelling as written (the number tells them apart); dt_arch_parse gives the architecture. */
#define DT_ARCH_NAMES(X)                   \
    X("transformer_like", DT_ARCH_GPT2, 0) \
    X("gpt2", DT_ARCH_GPT2, 1)             \
    X("llama", DT_ARCH_LLAMA, 2)

#define DT_ARCHS_ALL 3u                     /* a field every architecture has */
#define DT_ARCHS_LLAMA (1u << DT_ARCH_LLAMA) /* ... the Llama family's only */

/* The model's shape fields, in the order the config prints them:
 * X(field, name, kind, default, minimum, minimum excluded, architectures, GPT-2's config.json
 * key, Llama's). `field` is dt_model_shape's member, `name` the config key model.NAME (nested
 * as Hugging Face nests it: rope_scaling.factor) and the checkpoint's trainer.json model.NAME;
 * kind INT (an int), DOUBLE, BOOL (an int 0/1). The fields every architecture has are
 * required in a config.json; an architecture's own take their default where it lacks them (as transformers' config classes do). A NULL key: not a plain key there
 * (num_labels is read from the classifier's labels; qkv_bias from model_type "qwen2"); a key
 * "a.b" is member b of the object a (rope_scaling's). Their meaning: DESIGN.md §3-4. */
#define DT_SHAPE_FIELDS(X)                                                                                             \
    X(n_layer, "n_layer", INT, "2", 1, 0, DT_ARCHS_ALL, "n_layer", "num_hidden_layers")                                \
    X(n_head, "n_head", INT, "4", 1, 0, DT_ARCHS_ALL, "n_head", "num_attention_heads")                                 \
    X(n_embd, "n_embd", INT, "128", 1, 0, DT_ARCHS_ALL, "n_embd", "hidden_size")                                       \
    X(vocab_size, "vocab_size", INT, "257", 1, 0, DT_ARCHS_ALL, "vocab_size", "vocab_size")                            \
    X(n_positions, "n_positions", INT, "64", 1, 0, DT_ARCHS_ALL, "n_positions", "max_position_embeddings")             \
    X(num_labels, "num_labels", INT, "0", 0, 0, DT_ARCHS_ALL, NULL, NULL)                                              \
    X(num_key_value_heads, "num_key_value_heads", INT, "0", 0, 0, DT_ARCHS_LLAMA, NULL, "num_key_value_heads")         \
    X(intermediate_size, "intermediate_size", INT, "0", 0, 0, DT_ARCHS_LLAMA, NULL, "intermediate_size")               \
    X(head_dim, "head_dim", INT, "0", 0, 0, DT_ARCHS_LLAMA, NULL, "head_dim")                                          \
    X(rope_theta, "rope_theta", DOUBLE, "10000", 0, 1, DT_ARCHS_LLAMA, NULL, "rope_theta")                             \
    X(rms_norm_eps, "rms_norm_eps", DOUBLE, "1e-6", 0, 1, DT_ARCHS_LLAMA, NULL, "rms_norm_eps")                        \
    X(tie_word_embeddings, "tie_word_embeddings", BOOL, "false", 0, 0, DT_ARCHS_LLAMA, NULL, "tie_word_embeddings")    \
    X(attention_bias, "attention_bias", BOOL, "false", 0, 0, DT_ARCHS_LLAMA, NULL, "attention_bias")                   \
    X(qkv_bias, "qkv_bias", BOOL, "false", 0, 0, DT_ARCHS_LLAMA, NULL, NULL)                                           \
    X(rope_scaling_factor, "rope_scaling.factor", DOUBLE, "0", 0, 0, DT_ARCHS_LLAMA, NULL, "rope_scaling.factor")      \
    X(rope_low_freq_factor, "rope_scaling.low_freq_factor", DOUBLE, "1", 0, 1, DT_ARCHS_LLAMA, NULL,                   \
      "rope_scaling.low_freq_factor")                                                                                  \
    X(rope_high_freq_factor, "rope_scaling.high_freq_factor", DOUBLE, "4", 0, 1, DT_ARCHS_LLAMA, NULL,                 \
      "rope_scaling.high_freq_factor")                                                                                 \
    X(rope_original_max_position_embeddings, "rope_scaling.original_max_position_embeddings", INT, "8192", 1, 0,       \
      DT_ARCHS_LLAMA, NULL, "rope_scaling.original_max_position_embeddings")

/* A model's shape: what the config, a checkpoint and a Hugging Face config.json say of it. */
typedef struct dt_model_shape {
    dt_arch arch;    /* model.type */
    int n_layer;     /* L */
    int n_head;      /* NH: query heads */
    int n_embd;      /* C: the residual stream's width (GPT-2: a multiple of NH) */
    int vocab_size;  /* V */
    int n_positions; /* P: the positions the model has (GPT-2: rows of wpe), >= data.seq_len */
    int num_labels;  /* 0 = language modelling, >= 2 classification */
    /* the Llama family's: */
    int num_key_value_heads; /* NKV, dividing NH (grouped-query attention); 0: NH */
    int intermediate_size;   /* I: the SwiGLU MLP's width (required) */
    int head_dim;            /* hs; 0: C / NH */
    double rope_theta;       /* RoPE's base */
    double rms_norm_eps;     /* RMSNorm's epsilon */
    int tie_word_embeddings; /* the output head is the token embedding */
    int attention_bias;      /* q, k, v and o projections have biases */
    int qkv_bias;            /* q, k and v projections have biases, o not (Qwen 2) */
    /* RoPE's frequencies scaled as Llama 3.1 does (rope_scaling rope_type "llama3"); factor 0:
     * not scaled */
    double rope_scaling_factor;
    double rope_low_freq_factor;
    double rope_high_freq_factor;
    int rope_original_max_position_embeddings;
} dt_model_shape;

typedef enum { DT_SHAPE_INT = 0, DT_SHAPE_DOUBLE, DT_SHAPE_BOOL } dt_shape_kind;

/* One row of DT_SHAPE_FIELDS, for code that walks them all. */
typedef struct dt_shape_field {
    const char *name;            /* "n_layer" */
    dt_shape_kind kind;
    size_t offset;               /* in dt_model_shape */
    const char *def;             /* the default, as the config writes it */
    double min;                  /* the least value it takes (excluded when min_open) */
    int min_open;
    unsigned archs;              /* the architectures that have it (1 << dt_arch) */
    const char *hf[DT_ARCH_COUNT]; /* config.json's key per architecture; NULL: none */
} dt_shape_field;

/* The query heads' key/value heads (NKV) and the head size (hs), their defaults resolved. */
static inline int dt_shape_kv_heads(const dt_model_shape *s) {
    return s->num_key_value_heads > 0 ? s->num_key_value_heads : s->n_head;
}
static inline int dt_shape_head_dim(const dt_model_shape *s) {
    return s->head_dim > 0 ? s->head_dim : s->n_head > 0 ? s->n_embd / s->n_head : 0;
}

/* The fields, in DT_SHAPE_FIELDS's order; *n receives how many. */
const dt_shape_field *dt_shape_fields(int *n);
/* A field's value (an int or a bool as a double: exact) and its setter. */
double dt_shape_get(const dt_model_shape *s, const dt_shape_field *f);
void dt_shape_set(dt_model_shape *s, const dt_shape_field *f, double v);
/* Its default (def read as a value). */
double dt_shape_default(const dt_shape_field *f);
/* The value as the config prints it ("12", "1e-05", "true"), in buf (n bytes); returns buf. */
const char *dt_shape_str(const dt_model_shape *s, const dt_shape_field *f, char *buf, size_t n);

/* LoRA (model.lora): the products an adapter may target, X(name, architecture, the module's
 * Hugging Face path inside a layer). `name` is what model.lora.targets lists (as PEFT's
 * target_modules: a suffix of the module's path); bit i of a target mask is row i. */
#define DT_LORA_TARGETS(X)                               \
    X("c_attn", DT_ARCH_GPT2, "attn.c_attn")             \
    X("attn.c_proj", DT_ARCH_GPT2, "attn.c_proj")        \
    X("c_fc", DT_ARCH_GPT2, "mlp.c_fc")                  \
    X("mlp.c_proj", DT_ARCH_GPT2, "mlp.c_proj")          \
    X("q", DT_ARCH_LLAMA, "self_attn.q_proj")            \
    X("k", DT_ARCH_LLAMA, "self_attn.k_proj")            \
    X("v", DT_ARCH_LLAMA, "self_attn.v_proj")            \
    X("o", DT_ARCH_LLAMA, "self_attn.o_proj")            \
    X("gate", DT_ARCH_LLAMA, "mlp.gate_proj")            \
    X("up", DT_ARCH_LLAMA, "mlp.up_proj")                \
    X("down", DT_ARCH_LLAMA, "mlp.down_proj")
#define DT_LORA_MAX_TARGETS 16

/* model.lora: rank 0 is no LoRA. Each targeted product x W becomes x W + (alpha / rank) (x A^T) B^T,
 * A (rank, in), B (out, rank). */
typedef struct dt_lora {
    int rank;
    double alpha;
    unsigned targets; /* a mask of DT_LORA_TARGETS rows */
    int base_bf16;    /* model.lora.base_dtype bf16: the frozen matrices kept in bf16 (0: fp32) */
} dt_lora;

/* The number of DT_LORA_TARGETS rows; row i's name and Hugging Face module path (NULL past the end). */
int dt_lora_target_count(void);
const char *dt_lora_target_name(int i);
const char *dt_lora_target_module(int i);
/* The row named `name` (-1: none). */
int dt_lora_target_parse(const char *name);
/* The targets architecture a has, and those PEFT targets when none are named (GPT-2: c_attn;
 * Llama: q, v). */
unsigned dt_lora_arch_targets(dt_arch a);
unsigned dt_lora_default_targets(dt_arch a);
/* "q, k, v" for a mask, into buf (n bytes); returns buf. */
const char *dt_lora_targets_str(unsigned mask, char *buf, size_t n);

/* The architecture model.type names; DT_ERR_USAGE (no message) for anything else. */
dt_status dt_arch_parse(const char *type, dt_arch *out);
/* Its canonical name ("gpt2") and Hugging Face's model_type and class names. */
const char *dt_arch_name(dt_arch a);
const char *dt_arch_hf_model_type(dt_arch a);
const char *dt_arch_hf_class(dt_arch a, int classifier); /* "GPT2LMHeadModel", "GPT2ForSequenceClassification" */
/* The architecture of a config.json's model_type ("gpt2", "llama", "mistral", "qwen2"); DT_ERR_USAGE
 * (no message) for one dtrain does not build. */
dt_status dt_arch_from_hf(const char *model_type, dt_arch *out);

#endif
