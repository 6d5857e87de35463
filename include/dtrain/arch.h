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

typedef enum { DT_ARCH_GPT2 = 0, DT_ARCH_COUNT } dt_arch;

/* model.type's spellings: X(spelling, architecture, a number of its own). The config keeps
 * the spelling as written (the number tells them apart); dt_arch_parse gives the architecture. */
#define DT_ARCH_NAMES(X)                   \
    X("transformer_like", DT_ARCH_GPT2, 0) \
    X("gpt2", DT_ARCH_GPT2, 1)

/* The model's shape fields, in the order the config prints them:
 * X(field, kind, default, minimum, GPT-2's config.json key). `field` is the config key
 * model.FIELD, the checkpoint's trainer.json model.FIELD and dt_model_shape's member; kind
 * INT (an int). A NULL config.json key: not a plain key there (num_labels is read from
 * the classifier's labels). */
#define DT_SHAPE_FIELDS(X)                                  \
    X(n_layer, INT, "2", 1, "n_layer")                      \
    X(n_head, INT, "4", 1, "n_head")                        \
    X(n_embd, INT, "128", 1, "n_embd")                      \
    X(vocab_size, INT, "257", 1, "vocab_size")              \
    X(n_positions, INT, "64", 1, "n_positions")             \
    X(num_labels, INT, "0", 0, NULL)

/* A model's shape: what the config, a checkpoint and a Hugging Face config.json say of it. */
typedef struct dt_model_shape {
    dt_arch arch;    /* model.type */
    int n_layer;     /* L */
    int n_head;      /* NH */
    int n_embd;      /* C, a multiple of NH */
    int vocab_size;  /* V */
    int n_positions; /* P: the positions the model has (GPT-2: rows of wpe), >= data.seq_len */
    int num_labels;  /* 0 = language modelling, >= 2 classification */
} dt_model_shape;

typedef enum { DT_SHAPE_INT = 0 } dt_shape_kind;

/* One row of DT_SHAPE_FIELDS, for code that walks them all. */
typedef struct dt_shape_field {
    const char *name;            /* "n_layer" */
    dt_shape_kind kind;
    size_t offset;               /* in dt_model_shape */
    double min;                  /* the least value it takes */
    const char *hf[DT_ARCH_COUNT]; /* config.json's key per architecture; NULL: none */
} dt_shape_field;

/* The fields, in DT_SHAPE_FIELDS's order; *n receives how many. */
const dt_shape_field *dt_shape_fields(int *n);
/* A field's value (an int, as a double: exact) and its setter. */
double dt_shape_get(const dt_model_shape *s, const dt_shape_field *f);
void dt_shape_set(dt_model_shape *s, const dt_shape_field *f, double v);
/* The value as the config prints it ("12"), in buf (n bytes); returns buf. */
const char *dt_shape_str(const dt_model_shape *s, const dt_shape_field *f, char *buf, size_t n);

/* The architecture model.type names; DT_ERR_USAGE (no message) for anything else. */
dt_status dt_arch_parse(const char *type, dt_arch *out);
/* Its canonical name ("gpt2") and Hugging Face's model_type and class names. */
const char *dt_arch_name(dt_arch a);
const char *dt_arch_hf_model_type(dt_arch a);
const char *dt_arch_hf_class(dt_arch a, int classifier); /* "GPT2LMHeadModel", "GPT2ForSequenceClassification" */

#endif
