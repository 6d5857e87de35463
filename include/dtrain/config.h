/* config.h — the validated run configuration (DESIGN.md §3).
 *
 * dt_config_load() reads a YAML file with libyaml, applies `--set key.path=value`
 * overrides, substitutes ${ENV} values, fills defaults and validates types, ranges and
 * cross-field rules. Errors are DT_ERR_CONFIG with a message of the form
 *   FILE:LINE: key.path: expected ..., got "..." (hint: ...)
 * Unknown keys are errors with a did-you-mean. The struct is plain data: the caller
 * owns it, nothing inside needs freeing. */
#ifndef DTRAIN_CONFIG_H
#define DTRAIN_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "dtrain/arch.h"
#include "dtrain/status.h"

/* training.grad_comm_dtype: how gradients travel between workers (comm.h says what bf16 means) */
typedef enum { DT_WIRE_F32 = 0, DT_WIRE_BF16 } dt_wire;
/* training.hierarchical_allreduce (comm_plan.h) */
typedef enum { DT_HIER_AUTO = 0, DT_HIER_ON, DT_HIER_OFF } dt_hier_mode;

#define DT_PATH_MAX 1024

typedef enum { DT_DEVICE_AUTO = 0, DT_DEVICE_CPU, DT_DEVICE_CUDA } dt_device_kind;
typedef enum { DT_COMM_AUTO = 0, DT_COMM_SHM, DT_COMM_NCCL, DT_COMM_MPI, DT_COMM_TCP } dt_comm_kind; /* "collective" == auto */
typedef enum { DT_PREC_AUTO = 0, DT_PREC_FP32, DT_PREC_BF16 } dt_precision;
typedef enum { DT_SCHED_CONSTANT = 0, DT_SCHED_COSINE, DT_SCHED_LINEAR } dt_schedule;
typedef enum { DT_FORMAT_AUTO = 0, DT_FORMAT_TOKENS, DT_FORMAT_TSV, DT_FORMAT_CHAT, DT_FORMAT_COMPLETION } dt_data_format;
typedef enum { DT_RESUME_AUTO = 0, DT_RESUME_NEVER, DT_RESUME_PATH } dt_resume_kind;
typedef enum { DT_BEST_NONE = 0, DT_BEST_LOSS, DT_BEST_ACCURACY, DT_BEST_F1 } dt_best_metric;

/* A key whose value was written with ${NAME}: the text as written. */
#define DT_CONFIG_MAX_ENV 16
#define DT_MAX_VAL_SETS 8  /* data.val_path as a list or a map: at most this many sets */
typedef struct {
    char key[64];            /* "data.train_path", "optimizer.betas[0]" */
    char text[DT_PATH_MAX];  /* "${DATA}/train.tsv" */
    char value[DT_PATH_MAX + 64]; /* the key's value as printed when loaded: a field changed since
                                     (bench, an external launcher's world size) prints as it is */
} dt_config_env_ref;

typedef struct dt_config {
    char source[DT_PATH_MAX]; /* the config file as given ("" when loaded from a string) */
    /* The keys set with ${NAME}. Printing, saving and dt_config_diff show this text, never
     * the substituted value (which may be a secret); dt_config_digest uses the value. */
    struct {
        int n;
        dt_config_env_ref ref[DT_CONFIG_MAX_ENV];
    } env;
    struct {
        char dir[DT_PATH_MAX]; /* default: runs/<config file stem> */
    } run;
    struct {
        int num_workers;            /* >= 1, default 1 */
        int use_gpu;                /* -1 = not given, 0/1 as given */
        dt_device_kind device;      /* resolved: use_gpu given -> cpu/cuda; else `device` (default auto) */
        int gpus_per_worker;        /* resources_per_worker.gpu, must be 1 (0 allowed on CPU) */
        dt_comm_kind comm;          /* communication_backend */
        int epochs;                 /* >= 1, default 1 */
        long max_steps;             /* 0 = use epochs; > 0 overrides epochs */
        int grad_accum_steps;       /* >= 1, default 1 */
        dt_precision precision;     /* auto = bf16 on GPU, fp32 on CPU */
        uint64_t seed;              /* default 1337 */
        double collective_timeout_s;/* > 0, default 300 */
        int cpu_threads_per_worker; /* 0 = cores / num_workers */
        int adapt_cpu_threads;      /* 1 (default): with cpu_threads_per_worker 0, fewer threads while other
                                       processes keep cores busy (the launcher measures it) */
        long check_replicas_every;  /* default 100, 0 = off */
        int zero_stage;             /* 0 (default): every worker holds the whole AdamW state; 1: each worker
                                       updates its part of every bucket (ZeRO-1: gradients reduce-scattered,
                                       weights all-gathered, moments 1/num_workers) */
        int tensor_parallel;        /* T >= 1 (default 1): each layer split across T workers (Megatron's column/row
                                       products); num_workers = D x P x T, T dividing the heads (comm_plan.h dt_mesh) */
        int pipeline_parallel;      /* P >= 1 (default 1): only 1 so far */
        dt_wire grad_comm_dtype;    /* fp32 (default) or bf16: how gradients travel between workers (comm.h) */
        dt_hier_mode hierarchical_allreduce; /* auto (default), on, off: gradients reduced inside each host first
                                                (comm_plan.h) */
        int early_stopping_patience;/* 0 = off (default); N: stop after N evaluations in a row without a new
                                       best of checkpoint.best_metric (val_loss when that is none) */
    } training;
    struct {
        double lr;           /* > 0, default 3e-4 */
        double weight_decay; /* >= 0, default 0.01 */
        double beta1, beta2; /* betas: [b1, b2], each in [0,1), default [0.9, 0.999] */
        double eps;          /* > 0, default 1e-8 */
        double grad_clip;    /* >= 0, 0 = off, default 1.0 */
        dt_schedule schedule;/* default cosine */
        long warmup_steps;   /* >= 0, default 0 */
        double min_lr_ratio; /* [0,1], default 0.0 */
    } optimizer;
    struct {
        char train_path[DT_PATH_MAX]; /* required: file, directory or glob */
        char val_path[DT_PATH_MAX];   /* optional ("" = no evaluation); the first set's path */
        /* data.val_path given as a list of paths (each named by its file name without the
         * extension) or as a map name -> path: the validation sets, each evaluated and logged
         * under its name; the first is the one checkpoint.best_metric and early stopping read.
         * n_val_sets 0: a single path (val_path), named "val", logged as before. */
        int n_val_sets;
        struct {
            char name[32];
            char path[DT_PATH_MAX];
        } val_sets[DT_MAX_VAL_SETS];
        char tokenizer[DT_PATH_MAX];  /* "bytes" (default) or a tokenizer.json (byte-level BPE) */
        /* data.tokenizer_sha256: the SHA-256 of data.tokenizer's file (64 hex digits; "" for bytes),
         * computed at load when not given; given (a run's saved config.yaml records it), the file
         * must have it: a model never meets a tokenizer changed since it was trained */
        char tokenizer_sha256[65];
        dt_data_format format;        /* default auto */
        int train_on_all;             /* data.train_on: assistant (0, default) or all (1): chat and completion */
        int batch_size_per_worker;    /* >= 1, default 8 */
        int seq_len;                  /* >= 2, default 64 */
        int shuffle;                  /* default 1 */
        int packing;                  /* data.packing, default 0: chat and completion rows of several examples */
        int pad_to_longest;           /* data.pad_to: longest (1, default: a batch's rows cut to what its longest
                                         needs) or seq_len (0) */
    } data;
    struct {
        char type[32];                /* a spelling of DT_ARCH_NAMES (arch.h), as written */
        /* model.FIELD for each of arch.h's DT_SHAPE_FIELDS (defaults there; n_embd % n_head == 0;
         * n_positions defaults to data.seq_len and must be >= it); shape.arch from model.type */
        dt_model_shape shape;
        char init_from[DT_PATH_MAX];  /* "" = random init */
        dt_lora lora;                 /* model.lora: rank 0 (default) none; targets resolved (the
                                         architecture's default when not given) */
        char lora_init_from[DT_PATH_MAX]; /* model.lora.init_from: "" (adapters from the seed), a PEFT adapter
                                             directory (adapter_config.json agreeing with model.lora) or a file */
    } model;
    struct {
        long every_steps;   /* 0 = only at the end, default 100 */
        long max_batches;   /* 0 = all, default 0 */
    } eval;
    struct {
        long every_steps;          /* 0 = only at the end, default 500 */
        int keep_last;             /* >= 1, default 3 */
        dt_resume_kind resume;     /* default auto */
        char resume_path[DT_PATH_MAX];
        dt_best_metric best_metric; /* none (default), val_loss (lower is better), val_accuracy, val_f1
                                       (macro-F1; higher is better): the best weights kept in run.dir/best/ */
    } checkpoint;
    struct {
        long every_steps;   /* >= 1, default 10 */
        int tensorboard;    /* default 1 */
        double monitor_every_s; /* > 0, default 2: how often the launcher samples each worker */
        int phase_times;    /* 0 (default); 1: each train record says how long forward, backward and the
                               optimizer took (the device waited for at the end of each: a benchmark aid) */
        long profile_step;  /* 0 = off (default): training step N is the range a profiler attached with
                               its own start deferred records (ops.h profile; ncu --profile-from-start off) */
        long sample_every_steps;  /* 0 = off (default): language models print generated text every N steps */
        char sample_prompt[256];  /* the text samples continue ("": from the end-of-text token, BPE only) */
        int sample_tokens;        /* new tokens per sample, default 64 */
    } logging;
    struct {
        int max_restarts;   /* >= 0, default 3 */
        double backoff_s;   /* >= 0, default 1.0 */
    } fault_tolerance;
} dt_config;

/* Fills every field with its default (data.train_path stays ""). */
void dt_config_defaults(dt_config *cfg);

/* Loads `path`, then applies `overrides` ("a.b=value", in order), then validates.
 * On error returns DT_ERR_CONFIG (or DT_ERR_IO if the file cannot be read, or is a FIFO, a
 * device or a directory: refused at once, "PATH: not a regular file (a FIFO)") with the message set;
 * `cfg` is then unspecified. */
dt_status dt_config_load(dt_config *cfg, const char *path, const char *const *overrides, int n_overrides);

/* Same from a string; `name` is used in messages in place of the file name. */
dt_status dt_config_load_string(dt_config *cfg, const char *name, const char *yaml,
                                const char *const *overrides, int n_overrides);

/* Loads a config that dtrain saved (a run directory's or a checkpoint's config.yaml)
 * without substituting the environment: a ${NAME} value stays as written (kept in `env`; a
 * string key holds the text, any other key its default), so a crafted file cannot print an
 * environment variable. For comparing with dt_config_diff, not for training. */
dt_status dt_config_load_saved(dt_config *cfg, const char *path);

/* Writes the resolved config as YAML that dt_config_load accepts; keys set with ${NAME}
 * are written as they were given. */
void dt_config_print(const dt_config *cfg, FILE *out);

/* CRC32 over every key and its resolved value (not the source file name): two configs with
 * the same digest train the same way. Stored in checkpoints. */
uint32_t dt_config_digest(const dt_config *cfg);
/* Lists the keys whose values differ as "key a -> b, ..." in buf (truncated to n); returns
 * how many differ. A key set with ${NAME} on either side is compared (and shown) as written. */
int dt_config_diff(const dt_config *a, const dt_config *b, char *buf, size_t n);
/* The same, leaving out key `skip` (e.g. "run.dir"; NULL: none). */
int dt_config_diff_except(const dt_config *a, const dt_config *b, const char *skip, char *buf, size_t n);

/* Key `path`'s value for a message or a log line, in buf (n bytes): as written ("${N}") when
 * it was set with ${NAME} and still holds that value, else the value as printed. */
const char *dt_config_shown(const dt_config *cfg, const char *path, char *buf, size_t n);

/* Names used in the printed config and messages. */
const char *dt_device_name(dt_device_kind d);
/* The kind a training.device value names ("cpu", "cuda", "auto"); DT_ERR_USAGE (no message)
 * for anything else. */
dt_status dt_device_parse(const char *name, dt_device_kind *out);

/* The validation sets: data.val_path's list or map, else its one path (named "val"); 0 sets
 * without data.val_path. */
static inline int dt_config_val_count(const dt_config *c) {
    return c->data.n_val_sets ? c->data.n_val_sets : c->data.val_path[0] ? 1 : 0;
}
static inline const char *dt_config_val_name(const dt_config *c, int i) {
    return c->data.n_val_sets ? c->data.val_sets[i].name : "val";
}
static inline const char *dt_config_val_path(const dt_config *c, int i) {
    return c->data.n_val_sets ? c->data.val_sets[i].path : c->data.val_path;
}

/* Why training.tensor_parallel and pipeline_parallel cannot run with the rest of cfg (the layout
 * of the workers, the model's heads and MLP, what is not built yet), into buf: returns buf and
 * sets *key to the key to blame; NULL when they can. Loading a config checks it (exit 2); so
 * does whoever changes those keys afterwards (dtrain bench --layouts). */
const char *dt_config_mesh_problem(const dt_config *cfg, const char **key, char *buf, size_t n);

#endif
