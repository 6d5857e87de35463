/* config.c — YAML config loading, `--set` overrides, defaults and validation (DESIGN.md §3).
 *
 * Everything a key needs to know (path, type, field, default, range, enum names, hint) lives
 * in one schema table, `keys[]`. The file is parsed with libyaml's document API; the tree is
 * walked from the root, every mapping key is looked up in the table by its dotted path and
 * every scalar is parsed by the rules of its type. A `--set a.b=value` override becomes a
 * one-node document (or a parsed YAML flow value) and goes through the same walk. Cross-field
 * rules run last, once the file and all overrides are in. Every message names the location
 * (FILE:LINE, FILE, or `--set TEXT`), the key, what was expected and what was found. */
#include "dtrain/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>
#include <yaml.h>
#include <zlib.h>

#include "dtrain/file.h"
#include "dtrain/hfdir.h"

/* ---- schema ------------------------------------------------------------------------- */

typedef enum {
    K_MAP,     /* a mapping whose keys are further schema entries */
    K_INT,     /* int */
    K_LONG,    /* long */
    K_U64,     /* uint64_t */
    K_DOUBLE,  /* double */
    K_BOOL,    /* int 0/1 */
    K_TRIBOOL, /* int -1 (not given)/0/1 */
    K_STR,     /* char[size] */
    K_ENUM,    /* int-sized enum, value from `names` */
    K_NAME,    /* char[size] holding the canonical spelling of one of `names` */
    K_BETAS,   /* two doubles: a YAML sequence [b1, b2], each in [0, 1) */
    K_RESUME,  /* checkpoint.resume: auto | never | a path */
    K_TARGETS  /* model.lora.targets: a YAML sequence of DT_LORA_TARGETS names, an unsigned mask */
} key_kind;

enum { R_MIN = 1, R_MAX = 2, R_MIN_OPEN = 4, R_MAX_OPEN = 8, R_NONEMPTY = 16 };

typedef struct {
    const char *name; /* the first spelling of a value is the canonical (printed) one */
    int value;
} enum_name;

typedef struct {
    const char *path;
    key_kind kind;
    size_t off, size;       /* the field in dt_config */
    size_t off2;            /* K_BETAS: beta2; K_RESUME: resume_path */
    const char *def;        /* default as text, parsed like a value (K_BETAS: "b1 b2") */
    unsigned flags;         /* R_* */
    double min, max;        /* range, when R_MIN / R_MAX are set */
    const enum_name *names; /* K_ENUM, K_NAME: terminated by {NULL, 0} */
    const char *hint;       /* appended to type/range errors of this key */
} key_def;

static const enum_name device_names[] = {
    {"cpu", DT_DEVICE_CPU}, {"cuda", DT_DEVICE_CUDA}, {"auto", DT_DEVICE_AUTO}, {NULL, 0}};
static const enum_name comm_names[] = {{"collective", DT_COMM_AUTO},
                                       {"auto", DT_COMM_AUTO},
                                       {"shm", DT_COMM_SHM},
                                       {"nccl", DT_COMM_NCCL},
                                       {"mpi", DT_COMM_MPI},
                                       {"tcp", DT_COMM_TCP},
                                       {NULL, 0}};
static const enum_name precision_names[] = {
    {"auto", DT_PREC_AUTO}, {"fp32", DT_PREC_FP32}, {"bf16", DT_PREC_BF16}, {NULL, 0}};
static const enum_name grad_comm_names[] = {{"fp32", DT_WIRE_F32}, {"bf16", DT_WIRE_BF16}, {NULL, 0}};
static const enum_name hier_names[] = {{"auto", DT_HIER_AUTO}, {"on", DT_HIER_ON}, {"off", DT_HIER_OFF}, {NULL, 0}};
static const enum_name schedule_names[] = {{"constant", DT_SCHED_CONSTANT},
                                           {"cosine", DT_SCHED_COSINE},
                                           {"linear", DT_SCHED_LINEAR},
                                           {NULL, 0}};
static const enum_name format_names[] = {
    {"auto", DT_FORMAT_AUTO},       {"tokens", DT_FORMAT_TOKENS},         {"tsv", DT_FORMAT_TSV},
    {"chat", DT_FORMAT_CHAT},       {"completion", DT_FORMAT_COMPLETION}, {NULL, 0}};
static const enum_name base_dtype_names[] = {{"fp32", 0}, {"bf16", 1}, {NULL, 0}};
static const enum_name train_on_names[] = {{"assistant", 0}, {"all", 1}, {NULL, 0}};
static const enum_name pad_to_names[] = {{"longest", 1}, {"seq_len", 0}, {NULL, 0}};
#define TYPE_NAME(spelling, arch, id) {spelling, id},
static const enum_name model_type_names[] = {DT_ARCH_NAMES(TYPE_NAME){NULL, 0}};
#undef TYPE_NAME
static const enum_name best_metric_names[] = {{"none", DT_BEST_NONE},
                                              {"val_loss", DT_BEST_LOSS},
                                              {"val_accuracy", DT_BEST_ACCURACY},
                                              {"val_f1", DT_BEST_F1},
                                              {NULL, 0}};

#define FLD(m) offsetof(dt_config, m), sizeof(((dt_config *)0)->m)
#define SECTION(p) {p, K_MAP, 0, 0, 0, NULL, 0, 0, 0, NULL, NULL}
#define KEY(p, kind, m, def, ...) {p, kind, FLD(m), 0, def, __VA_ARGS__, NULL, NULL} /* ...: flags, min, max */
#define ENUM(p, m, def, names) {p, K_ENUM, FLD(m), 0, def, 0, 0, 0, names, NULL}
#define GE(lo) (R_MIN), (lo), 0
#define GT(lo) (R_MIN | R_MIN_OPEN), (lo), 0
#define IN(lo, hi) (R_MIN | R_MAX), (lo), (hi)
#define ANY 0, 0, 0

/* Printed in this order; a section's entry comes before its keys. */
static const key_def keys[] = {
    SECTION("run"),
    KEY("run.dir", K_STR, run.dir, "", R_NONEMPTY, 0, 0),

    SECTION("training"),
    KEY("training.num_workers", K_INT, training.num_workers, "1", IN(1, DT_MAX_WORLD)),
    KEY("training.use_gpu", K_TRIBOOL, training.use_gpu, NULL, ANY),
    ENUM("training.device", training.device, "auto", device_names),
    {"training.resources_per_worker", K_MAP, 0, 0, 0, NULL, 0, 0, 0, NULL,
     "write resources_per_worker: {gpu: 1}"},
    KEY("training.resources_per_worker.gpu", K_INT, training.gpus_per_worker, "1", IN(0, 1)),
    ENUM("training.communication_backend", training.comm, "collective", comm_names),
    KEY("training.epochs", K_INT, training.epochs, "1", GE(1)),
    KEY("training.max_steps", K_LONG, training.max_steps, "0", GE(0)),
    KEY("training.grad_accum_steps", K_INT, training.grad_accum_steps, "1", GE(1)),
    ENUM("training.precision", training.precision, "auto", precision_names),
    KEY("training.seed", K_U64, training.seed, "1337", GE(0)),
    KEY("training.collective_timeout_s", K_DOUBLE, training.collective_timeout_s, "300", GT(0)),
    KEY("training.cpu_threads_per_worker", K_INT, training.cpu_threads_per_worker, "0", GE(0)),
    KEY("training.adapt_cpu_threads", K_BOOL, training.adapt_cpu_threads, "true", ANY),
    KEY("training.check_replicas_every", K_LONG, training.check_replicas_every, "100", GE(0)),
    KEY("training.zero_stage", K_INT, training.zero_stage, "0", IN(0, 1)),
    KEY("training.tensor_parallel", K_INT, training.tensor_parallel, "1", IN(1, DT_MAX_WORLD)),
    KEY("training.pipeline_parallel", K_INT, training.pipeline_parallel, "1", IN(1, DT_MAX_WORLD)),
    ENUM("training.grad_comm_dtype", training.grad_comm_dtype, "fp32", grad_comm_names),
    ENUM("training.hierarchical_allreduce", training.hierarchical_allreduce, "auto", hier_names),
    KEY("training.early_stopping_patience", K_INT, training.early_stopping_patience, "0", GE(0)),

    SECTION("optimizer"),
    KEY("optimizer.lr", K_DOUBLE, optimizer.lr, "3e-4", GT(0)),
    KEY("optimizer.weight_decay", K_DOUBLE, optimizer.weight_decay, "0.01", GE(0)),
    {"optimizer.betas", K_BETAS, FLD(optimizer.beta1), offsetof(dt_config, optimizer.beta2),
     "0.9 0.999", 0, 0, 0, NULL, "write betas: [0.9, 0.95]"},
    KEY("optimizer.eps", K_DOUBLE, optimizer.eps, "1e-8", GT(0)),
    KEY("optimizer.grad_clip", K_DOUBLE, optimizer.grad_clip, "1.0", GE(0)),
    ENUM("optimizer.schedule", optimizer.schedule, "cosine", schedule_names),
    KEY("optimizer.warmup_steps", K_LONG, optimizer.warmup_steps, "0", GE(0)),
    KEY("optimizer.min_lr_ratio", K_DOUBLE, optimizer.min_lr_ratio, "0", IN(0, 1)),

    SECTION("data"),
    KEY("data.train_path", K_STR, data.train_path, "", R_NONEMPTY, 0, 0),
    KEY("data.val_path", K_STR, data.val_path, "", ANY),
    ENUM("data.format", data.format, "auto", format_names),
    ENUM("data.train_on", data.train_on_all, "assistant", train_on_names),
    KEY("data.tokenizer", K_STR, data.tokenizer, "bytes", R_NONEMPTY, 0, 0),
    KEY("data.tokenizer_sha256", K_STR, data.tokenizer_sha256, "", ANY),
    KEY("data.batch_size_per_worker", K_INT, data.batch_size_per_worker, "8", GE(1)),
    KEY("data.seq_len", K_INT, data.seq_len, "64", GE(2)),
    KEY("data.shuffle", K_BOOL, data.shuffle, "true", ANY),
    KEY("data.packing", K_BOOL, data.packing, "false", ANY),
    ENUM("data.pad_to", data.pad_to_longest, "longest", pad_to_names),

    SECTION("model"),
    SECTION("model.rope_scaling"), /* Llama 3.1's, nested as in config.json (arch.h) */
    {"model.type", K_NAME, FLD(model.type), 0, "transformer_like", 0, 0, 0, model_type_names, NULL},
#define SHAPE_RANGE_INT(min, open) (R_MIN | ((open) ? R_MIN_OPEN : 0)), (min), 0
#define SHAPE_RANGE_DOUBLE SHAPE_RANGE_INT
#define SHAPE_RANGE_BOOL(min, open) ANY
#define SHAPE_KEY(f, name, kind, def, min, open, archs, gpt2, llama) \
    KEY("model." name, K_##kind, model.shape.f, def, SHAPE_RANGE_##kind(min, open)),
    DT_SHAPE_FIELDS(SHAPE_KEY)
#undef SHAPE_KEY
    KEY("model.init_from", K_STR, model.init_from, "", ANY),
    SECTION("model.lora"),
    KEY("model.lora.rank", K_INT, model.lora.rank, "0", IN(0, 4096)),
    KEY("model.lora.alpha", K_DOUBLE, model.lora.alpha, "8", GT(0)),
    KEY("model.lora.init_from", K_STR, model.lora_init_from, "", ANY),
    ENUM("model.lora.base_dtype", model.lora.base_bf16, "fp32", base_dtype_names),
    {"model.lora.targets", K_TARGETS, FLD(model.lora.targets), 0, "", 0, 0, 0, NULL,
     "write targets: [c_attn] (gpt2) or [q, v] (llama)"},

    SECTION("eval"),
    KEY("eval.every_steps", K_LONG, eval.every_steps, "100", GE(0)),
    KEY("eval.max_batches", K_LONG, eval.max_batches, "0", GE(0)),

    SECTION("checkpoint"),
    KEY("checkpoint.every_steps", K_LONG, checkpoint.every_steps, "500", GE(0)),
    KEY("checkpoint.keep_last", K_INT, checkpoint.keep_last, "3", GE(1)),
    {"checkpoint.resume", K_RESUME, FLD(checkpoint.resume), offsetof(dt_config, checkpoint.resume_path),
     "auto", 0, 0, 0, NULL, NULL},
    ENUM("checkpoint.best_metric", checkpoint.best_metric, "none", best_metric_names),

    SECTION("logging"),
    KEY("logging.every_steps", K_LONG, logging.every_steps, "10", GE(1)),
    KEY("logging.tensorboard", K_BOOL, logging.tensorboard, "true", ANY),
    KEY("logging.monitor_every_s", K_DOUBLE, logging.monitor_every_s, "2.0", GT(0)),
    KEY("logging.phase_times", K_BOOL, logging.phase_times, "false", ANY),
    KEY("logging.profile_step", K_LONG, logging.profile_step, "0", GE(0)),
    KEY("logging.sample_every_steps", K_LONG, logging.sample_every_steps, "0", GE(0)),
    KEY("logging.sample_prompt", K_STR, logging.sample_prompt, "", ANY),
    KEY("logging.sample_tokens", K_INT, logging.sample_tokens, "64", IN(1, 100000)),

    SECTION("fault_tolerance"),
    KEY("fault_tolerance.max_restarts", K_INT, fault_tolerance.max_restarts, "3", GE(0)),
    KEY("fault_tolerance.backoff_s", K_DOUBLE, fault_tolerance.backoff_s, "1.0", GE(0)),
};

#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

_Static_assert(sizeof(dt_device_kind) == sizeof(int) && sizeof(dt_comm_kind) == sizeof(int) &&
                   sizeof(dt_precision) == sizeof(int) && sizeof(dt_schedule) == sizeof(int) &&
                   sizeof(dt_data_format) == sizeof(int) && sizeof(dt_resume_kind) == sizeof(int) &&
                   sizeof(dt_best_metric) == sizeof(int),
               "enum fields are written as int");

static int key_index(const char *path) {
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].path, path) == 0) return i;
    return -1;
}

static const char *enum_canonical(const enum_name *names, int value) {
    for (const enum_name *e = names; e->name; e++)
        if (e->value == value) return e->name;
    return "?";
}

/* "an integer >= 1", "a number in [0, 1)", "one of cpu, cuda, auto", ... */
static void describe(const key_def *k, char *buf, size_t n) {
    size_t len = 0;
    switch (k->kind) {
    case K_MAP: snprintf(buf, n, "a mapping"); return;
    case K_INT:
    case K_LONG:
    case K_U64: len = (size_t)snprintf(buf, n, "an integer"); break;
    case K_DOUBLE: len = (size_t)snprintf(buf, n, "a number"); break;
    case K_BOOL:
    case K_TRIBOOL: snprintf(buf, n, "a boolean (true or false)"); return;
    case K_STR: snprintf(buf, n, (k->flags & R_NONEMPTY) ? "a non-empty path" : "a string"); return;
    case K_BETAS: snprintf(buf, n, "a list of two numbers [beta1, beta2]"); return;
    case K_RESUME: snprintf(buf, n, "auto, never or a checkpoint path"); return;
    case K_TARGETS: {
        char g[128], l[128];
        snprintf(buf, n, "a list of the projections to adapt (gpt2: %s; llama: %s)",
                 dt_lora_targets_str(dt_lora_arch_targets(DT_ARCH_GPT2), g, sizeof g),
                 dt_lora_targets_str(dt_lora_arch_targets(DT_ARCH_LLAMA), l, sizeof l));
        return;
    }
    case K_ENUM:
    case K_NAME:
        len = (size_t)snprintf(buf, n, "one of ");
        for (const enum_name *e = k->names; e->name && len < n; e++)
            len += (size_t)snprintf(buf + len, n - len, "%s%s", e == k->names ? "" : ", ", e->name);
        return;
    }
    if (len >= n) return;
    if ((k->flags & R_MIN) && (k->flags & R_MAX))
        snprintf(buf + len, n - len, " in %c%g, %g%c", (k->flags & R_MIN_OPEN) ? '(' : '[', k->min,
                 k->max, (k->flags & R_MAX_OPEN) ? ')' : ']');
    else if (k->flags & R_MIN)
        snprintf(buf + len, n - len, " %s %g", (k->flags & R_MIN_OPEN) ? ">" : ">=", k->min);
    else if (k->flags & R_MAX)
        snprintf(buf + len, n - len, " %s %g", (k->flags & R_MAX_OPEN) ? "<" : "<=", k->max);
}

static int in_range(const key_def *k, double v) {
    if (k->flags & R_MIN) {
        if ((k->flags & R_MIN_OPEN) ? !(v > k->min) : !(v >= k->min)) return 0;
    }
    if (k->flags & R_MAX) {
        if ((k->flags & R_MAX_OPEN) ? !(v < k->max) : !(v <= k->max)) return 0;
    }
    return 1;
}

/* ---- scalar parsing --------------------------------------------------------------------- */

static int parse_integer(const char *s, long long *out) {
    const char *p = s;
    if (*p == '+' || *p == '-') p++;
    if (!isdigit((unsigned char)*p)) return 0;
    for (const char *q = p; *q; q++)
        if (!isdigit((unsigned char)*q)) return 0;
    errno = 0;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (errno == ERANGE || *end) return 0;
    *out = v;
    return 1;
}

static int parse_number(const char *s, double *out) {
    if (!*s || isspace((unsigned char)*s)) return 0;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(v)) return 0;
    *out = v;
    return 1;
}

static int parse_bool(const char *s, int *out) {
    static const char *const yes[] = {"true", "yes", "on", "1"}, *const no[] = {"false", "no", "off", "0"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(s, yes[i]) == 0) return *out = 1, 1;
        if (strcasecmp(s, no[i]) == 0) return *out = 0, 1;
    }
    return 0;
}

static void put_int(dt_config *cfg, size_t off, int v) { memcpy((char *)cfg + off, &v, sizeof v); }

static void put_str(dt_config *cfg, size_t off, size_t size, const char *s) {
    /* zero the whole buffer so that configs compare equal byte for byte */
    memset((char *)cfg + off, 0, size);
    memcpy((char *)cfg + off, s, strlen(s));
}

typedef enum { PV_OK = 0, PV_BAD, PV_TOO_LONG } parse_result;

/* Parses `s` by the rules of `k` and stores it; K_BETAS takes one element (`elem` 0 or 1). */
static parse_result parse_value(const key_def *k, dt_config *cfg, const char *s, int elem) {
    char *dst = (char *)cfg + k->off;
    long long iv;
    double dv;
    int bv;
    switch (k->kind) {
    case K_MAP: return PV_BAD;
    case K_INT:
        if (!parse_integer(s, &iv) || iv < INT_MIN || iv > INT_MAX || !in_range(k, (double)iv)) return PV_BAD;
        put_int(cfg, k->off, (int)iv);
        return PV_OK;
    case K_LONG: {
        if (!parse_integer(s, &iv) || iv < LONG_MIN || iv > LONG_MAX || !in_range(k, (double)iv)) return PV_BAD;
        long lv = (long)iv;
        memcpy(dst, &lv, sizeof lv);
        return PV_OK;
    }
    case K_U64: {
        const char *p = s + (*s == '+');
        if (!isdigit((unsigned char)*p)) return PV_BAD;
        for (const char *q = p; *q; q++)
            if (!isdigit((unsigned char)*q)) return PV_BAD;
        errno = 0;
        unsigned long long uv = strtoull(p, NULL, 10);
        if (errno == ERANGE) return PV_BAD;
        uint64_t u = (uint64_t)uv;
        memcpy(dst, &u, sizeof u);
        return PV_OK;
    }
    case K_DOUBLE:
    case K_BETAS: {
        if (!parse_number(s, &dv)) return PV_BAD;
        if (k->kind == K_BETAS) {
            if (!(dv >= 0.0 && dv < 1.0)) return PV_BAD;
            memcpy((char *)cfg + (elem ? k->off2 : k->off), &dv, sizeof dv);
        } else {
            if (!in_range(k, dv)) return PV_BAD;
            memcpy(dst, &dv, sizeof dv);
        }
        return PV_OK;
    }
    case K_BOOL:
    case K_TRIBOOL:
        if (!parse_bool(s, &bv)) return PV_BAD;
        put_int(cfg, k->off, bv);
        return PV_OK;
    case K_STR:
        if ((k->flags & R_NONEMPTY) && !*s) return PV_BAD;
        if (strlen(s) >= k->size) return PV_TOO_LONG;
        put_str(cfg, k->off, k->size, s);
        return PV_OK;
    case K_ENUM:
    case K_NAME:
        for (const enum_name *e = k->names; e->name; e++) {
            if (strcasecmp(s, e->name) != 0) continue;
            if (k->kind == K_ENUM) put_int(cfg, k->off, e->value);
            else put_str(cfg, k->off, k->size, enum_canonical(k->names, e->value));
            return PV_OK;
        }
        return PV_BAD;
    case K_TARGETS: { /* one element: the first resets the mask */
        unsigned mask;
        memcpy(&mask, dst, sizeof mask);
        if (!*s && elem == 0) mask = 0; /* the default: none named */
        else {
            const int t = dt_lora_target_parse(s);
            if (t < 0) return PV_BAD;
            mask = (elem ? mask : 0) | 1u << t;
        }
        memcpy(dst, &mask, sizeof mask);
        return PV_OK;
    }
    case K_RESUME: {
        size_t path_size = sizeof(((dt_config *)0)->checkpoint.resume_path);
        if (!*s) return PV_BAD;
        if (strcasecmp(s, "auto") == 0 || strcasecmp(s, "never") == 0) {
            put_int(cfg, k->off, strcasecmp(s, "auto") == 0 ? DT_RESUME_AUTO : DT_RESUME_NEVER);
            put_str(cfg, k->off2, path_size, "");
            return PV_OK;
        }
        if (strlen(s) >= path_size) return PV_TOO_LONG;
        put_int(cfg, k->off, DT_RESUME_PATH);
        put_str(cfg, k->off2, path_size, s);
        return PV_OK;
    }
    }
    return PV_BAD;
}

/* ---- loading context and messages ----------------------------------------------------- */

typedef struct {
    int given;
    int line; /* 1-based line in the file; 0 when it came from an override */
    int ovr;  /* index of the override that set it last, -1 for the file */
} key_seen;

typedef struct {
    dt_config *cfg;
    const char *name;              /* file name (or string name) used in messages */
    const char *const *overrides;
    int cur_ovr;                   /* the override being applied, -1 while reading the file */
    const char *text;              /* the file's bytes (for locating encoding errors) */
    size_t len;
    int no_env;                    /* a saved config: ${NAME} is kept as written, not substituted */
    key_seen seen[N_KEYS];
} load_ctx;

/* The length of the well-formed UTF-8 character at p (1-4), 0 when it is not one (a stray
 * byte, an overlong form, a surrogate, beyond U+10FFFF) or p is at the end. */
static int utf8_len(const unsigned char *p) {
    unsigned c = p[0];
    int n = c == 0 ? -1 : c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2 : (c & 0xf8) == 0xf0 ? 3 : -1;
    if (n < 0) return 0;
    unsigned cp = n == 0 ? c : n == 1 ? c & 0x1f : n == 2 ? c & 0x0f : c & 0x07;
    for (int k = 1; k <= n; k++) {
        if ((p[k] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (p[k] & 0x3f);
    }
    static const unsigned min[4] = {0, 0x80, 0x800, 0x10000};
    if (cp < min[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return n + 1;
}

/* Offset of the first byte of `s` that is not well-formed UTF-8, or -1. YAML text is UTF-8,
 * and so are the values a saved config.yaml must hold. */
static long utf8_bad_at(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; p[i];) {
        int n = utf8_len(p + i);
        if (!n) return (long)i;
        i += (size_t)n;
    }
    return -1;
}

/* A value as messages quote it: its first line, at most QUOTE_MAX bytes, control characters
 * (C0, DEL, C1) and bytes that are not UTF-8 as \xNN, "..." when cut: nothing in it can drive
 * a terminal. Returns buf. */
#define QUOTE_MAX 80
typedef struct {
    char s[4 * QUOTE_MAX + 8];
} quoted;
/* The escaping of quote_line into out (4 * max + 4 bytes at least), up to `max` bytes of v;
 * with one_line it stops at a newline, else a newline is \x0a too. */
static const char *quote_text(const char *v, size_t max, int one_line, char *out, size_t outsize) {
    size_t k = 0, i = 0;
    while (v[i] && !(one_line && v[i] == '\n') && i < max) {
        const unsigned char *u = (const unsigned char *)v + i;
        int n = utf8_len(u);
        if (n == 0 || u[0] < 0x20 || u[0] == 0x7f || (u[0] == 0xc2 && u[1] <= 0x9f)) {
            k += (size_t)snprintf(out + k, outsize - k, "\\x%02x", n == 2 ? u[1] : u[0]);
            i += n == 2 ? 2 : 1;
        } else {
            memcpy(out + k, u, (size_t)n);
            k += (size_t)n;
            i += (size_t)n;
        }
    }
    out[k] = '\0';
    if (v[i]) snprintf(out + k, outsize - k, "...");
    return out;
}

static const char *quote_line(const char *v, quoted *q) { return quote_text(v, QUOTE_MAX, 1, q->s, sizeof q->s); }

/* A file name or key path in a message: whole (up to DT_PATH_MAX bytes), escaped alike. */
typedef struct {
    char s[4 * DT_PATH_MAX + 8];
} quoted_name;
static const char *quote_name(const char *v, quoted_name *q) { return quote_text(v, DT_PATH_MAX, 0, q->s, sizeof q->s); }

/* Formats "LOCATION: [PATH: ]MESSAGE" with LOCATION = --set TEXT | NAME:LINE | NAME. */
static dt_status fail_at(const load_ctx *c, int line, int ovr, const char *path, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static dt_status fail_at(const load_ctx *c, int line, int ovr, const char *path, const char *fmt, ...) {
    char loc[sizeof(quoted_name) + 64], msg[1536];
    quoted q;
    quoted_name qn, qp;
    if (ovr >= 0) snprintf(loc, sizeof loc, "--set %s", quote_line(c->overrides[ovr], &q));
    else if (line > 0) snprintf(loc, sizeof loc, "%s:%d", quote_name(c->name, &qn), line);
    else snprintf(loc, sizeof loc, "%s", quote_name(c->name, &qn));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (path) return dt_error_set(DT_ERR_CONFIG, "%s: %s: %s", loc, quote_name(path, &qp), msg);
    return dt_error_set(DT_ERR_CONFIG, "%s: %s", loc, msg);
}

static int node_line(const load_ctx *c, const yaml_node_t *node) {
    return c->cur_ovr >= 0 ? 0 : (int)node->start_mark.line + 1;
}

#define fail_node(c, node, path, ...) fail_at((c), node_line((c), (node)), (c)->cur_ovr, (path), __VA_ARGS__)

/* Location of a key for cross-field messages: where it was set last, or just the file. */
#define fail_key(c, idx, ...) \
    fail_at((c), (c)->seen[idx].line, (c)->seen[idx].given ? (c)->seen[idx].ovr : -1, keys[idx].path, __VA_ARGS__)

static const char *node_text(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static const char *node_kind_name(const yaml_node_t *n) {
    return n->type == YAML_MAPPING_NODE ? "a mapping" : n->type == YAML_SEQUENCE_NODE ? "a list" : "a value";
}

static int is_null_scalar(const yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE) return 0;
    const char *s = node_text(n);
    return !*s || strcmp(s, "~") == 0 || strcmp(s, "null") == 0 || strcmp(s, "Null") == 0 ||
           strcmp(s, "NULL") == 0;
}

static void hint_suffix(const key_def *k, char *buf, size_t n) {
    if (k && k->hint) snprintf(buf, n, " (hint: %s)", k->hint);
    else buf[0] = '\0';
}


/* ---- did you mean ----------------------------------------------------------------------- */

static int levenshtein(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    if (la > 127 || lb > 127) return 1000;
    int row[128];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

static const char *last_part(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

/* Appends the names of the direct children of mapping `parent` ("" = root) to buf. */
static void list_children(const char *parent, char *buf, size_t n) {
    size_t plen = strlen(parent), len = strlen(buf);
    int count = 0;
    for (int i = 0; i < N_KEYS && len < n; i++) {
        const char *p = keys[i].path, *child;
        if (plen == 0) child = p;
        else if (strncmp(p, parent, plen) == 0 && p[plen] == '.') child = p + plen + 1;
        else continue;
        if (strchr(child, '.')) continue; /* deeper: its mapping has its own K_MAP entry */
        len += (size_t)snprintf(buf + len, n - len, "%s%s", count++ ? ", " : "", child);
    }
}

/* "unknown key (did you mean X?)" or "unknown key (known keys in S: a, b, ...)". */
static dt_status fail_unknown(const load_ctx *c, const yaml_node_t *node, const char *path) {
    const char *leaf = last_part(path);
    size_t leaflen = strlen(leaf);
    int thr = leaflen <= 3 ? 1 : leaflen <= 6 ? 2 : 3;
    const char *what = strchr(path, '.') ? "unknown key" : "unknown section";
    int line = node ? node_line(c, node) : 0;
    char buf[1024] = "";

    int best = -1, best_d = thr + 1;
    for (int i = 0; i < N_KEYS; i++) {
        int d = levenshtein(path, keys[i].path);
        if (d < best_d) best_d = d, best = i;
    }
    if (best >= 0) return fail_at(c, line, c->cur_ovr, path, "%s (did you mean %s?)", what, keys[best].path);

    /* the same key name under another section (training.lr -> optimizer.lr), or a longer key
     * of the same section that contains it (data.batch_size -> data.batch_size_per_worker) */
    size_t parent_len = (size_t)(leaf - path);
    size_t len = 0;
    for (int pass = 0; pass < 2 && len == 0; pass++) {
        for (int i = 0; i < N_KEYS; i++) {
            const char *kp = keys[i].path, *kleaf = last_part(kp);
            int match = pass == 0 ? strcmp(kleaf, leaf) == 0
                                  : leaflen >= 3 && parent_len > 0 && strncmp(kp, path, parent_len) == 0 &&
                                        strchr(kp + parent_len, '.') == NULL && strstr(kleaf, leaf) != NULL;
            if (match && len < sizeof buf)
                len += (size_t)snprintf(buf + len, sizeof buf - len, "%s%s", len ? " or " : "", kp);
        }
    }
    if (len) return fail_at(c, line, c->cur_ovr, path, "%s (did you mean %s?)", what, buf);

    /* no close match: list what the deepest known parent mapping accepts */
    char parent[256];
    snprintf(parent, sizeof parent, "%.*s", parent_len ? (int)parent_len - 1 : 0, path);
    for (;;) {
        int idx = parent[0] ? key_index(parent) : -1;
        if (!parent[0] || (idx >= 0 && keys[idx].kind == K_MAP)) break;
        char *dot = strrchr(parent, '.');
        if (dot) *dot = '\0';
        else parent[0] = '\0';
    }
    if (parent[0]) snprintf(buf, sizeof buf, "known keys in %s: ", parent);
    else snprintf(buf, sizeof buf, "known sections: ");
    list_children(parent, buf, sizeof buf);
    return fail_at(c, line, c->cur_ovr, path, "%s (%s)", what, buf);
}

/* ---- ${ENV} substitution ---------------------------------------------------------------- */

/* Returns a malloc'd copy of `in` with every ${NAME} replaced by getenv(NAME). */
static dt_status expand_env(const load_ctx *c, const yaml_node_t *node, const char *path, const char *in,
                            char **out) {
    size_t cap = strlen(in) + 1, len = 0;
    char *buf = malloc(cap);
    if (!buf) return dt_error_set(DT_ERR_NOMEM, "out of memory expanding %s", path);
    for (const char *p = in; *p;) {
        const char *piece = p;
        size_t plen = 1;
        if (p[0] == '$' && p[1] == '{') {
            const char *name = p + 2, *end = strchr(name, '}');
            int ok = end && end > name && (isalpha((unsigned char)*name) || *name == '_');
            for (const char *q = name; ok && q < end; q++)
                if (!isalnum((unsigned char)*q) && *q != '_') ok = 0;
            if (!ok) {
                free(buf);
                quoted q;
                return fail_node(c, node, path, "expected ${NAME} with a NAME of letters, digits and _, got \"%s\"",
                                 quote_line(in, &q));
            }
            char var[256];
            snprintf(var, sizeof var, "%.*s", (int)(end - name), name);
            piece = getenv(var);
            if (!piece) {
                free(buf);
                return fail_node(c, node, path, "environment variable %s is not set", var);
            }
            plen = strlen(piece);
            p = end + 1;
        } else {
            p++;
        }
        if (len + plen + 1 > cap) {
            cap = 2 * (len + plen + 1);
            char *nb = realloc(buf, cap);
            if (!nb) {
                free(buf);
                return dt_error_set(DT_ERR_NOMEM, "out of memory expanding %s", path);
            }
            buf = nb;
        }
        memcpy(buf + len, piece, plen);
        len += plen;
    }
    buf[len] = '\0';
    *out = buf;
    return DT_OK;
}

/* ---- the walk --------------------------------------------------------------------------- */

/* "expected WHAT, got "TEXT"" (or "got a list" when text is NULL); `at` locates the error.
 * `written` is the value as the file wrote it when ${NAME} substitution made `text` out of
 * it (NULL otherwise): messages then quote that, never the substituted value. */
static dt_status fail_value(const load_ctx *c, const key_def *k, const yaml_node_t *at, const yaml_node_t *node,
                            const char *path, const char *text, const char *written, parse_result r) {
    char what[512], hint[256], shown[sizeof(quoted) + 64];
    describe(k, what, sizeof what);
    hint_suffix(k, hint, sizeof hint);
    size_t max = (k->kind == K_RESUME ? sizeof(((dt_config *)0)->checkpoint.resume_path) : k->size) - 1;
    if (r == PV_TOO_LONG && written) /* not even the substituted value's length */
        return fail_node(c, at, path, "expected a string of at most %zu bytes after substituting the environment%s",
                         max, hint);
    if (r == PV_TOO_LONG)
        return fail_node(c, at, path, "expected a string of at most %zu bytes, got %zu bytes%s", max, strlen(text),
                         hint);
    if (!text) return fail_node(c, at, path, "expected %s, got %s%s", what, node_kind_name(node), hint);
    quoted q;
    snprintf(shown, sizeof shown, "\"%s\"%s", quote_line(written ? written : text, &q),
             written ? " (after substituting the environment)" : "");
    if (k->kind == K_BETAS && path[strlen(path) - 1] == ']')
        return fail_node(c, at, path, "expected a number in [0, 1), got %s", shown);
    return fail_node(c, at, path, "expected %s, got %s%s", what, shown, hint);
}

/* The ${NAME} entry of key `path` in cfg, NULL when it was not written with one. */
static const dt_config_env_ref *env_entry(const dt_config *cfg, const char *path) {
    for (int i = 0; i < cfg->env.n; i++)
        if (strcmp(cfg->env.ref[i].key, path) == 0) return &cfg->env.ref[i];
    return NULL;
}

/* Its text as written (while loading: messages about the value just read). */
static const char *env_ref(const dt_config *cfg, const char *path) {
    const dt_config_env_ref *r = env_entry(cfg, path);
    return r ? r->text : NULL;
}

static void current_value(const dt_config *cfg, const char *path, char *buf, size_t n);
static void record_env_values(dt_config *cfg);

/* Its text as written, while the key still holds the value it was loaded with (while loading,
 * before that value is recorded: always). */
static const char *env_ref_live(const dt_config *cfg, const char *path) {
    const dt_config_env_ref *r = env_entry(cfg, path);
    if (!r) return NULL;
    if (!r->value[0]) return r->text;
    char now[sizeof r->value];
    current_value(cfg, path, now, sizeof now);
    return strcmp(now, r->value) == 0 ? r->text : NULL;
}

/* Records (text != NULL) or forgets (NULL) that `path` was written as `text`. */
static dt_status set_env_ref(const load_ctx *c, const yaml_node_t *node, const char *path, const char *text) {
    dt_config *cfg = c->cfg;
    int i = 0;
    while (i < cfg->env.n && strcmp(cfg->env.ref[i].key, path) != 0) i++;
    if (!text) {
        if (i < cfg->env.n) {
            cfg->env.ref[i] = cfg->env.ref[--cfg->env.n];
            memset(&cfg->env.ref[cfg->env.n], 0, sizeof cfg->env.ref[0]);
        }
        return DT_OK;
    }
    if (i == cfg->env.n) {
        if (cfg->env.n == DT_CONFIG_MAX_ENV)
            return fail_node(c, node, path, "expected at most %d keys set with ${NAME}, got more", DT_CONFIG_MAX_ENV);
        cfg->env.n++;
    }
    snprintf(cfg->env.ref[i].key, sizeof cfg->env.ref[i].key, "%s", path);
    if (strlen(text) >= sizeof cfg->env.ref[i].text)
        return fail_node(c, node, path, "expected a value of at most %zu bytes, got %zu bytes",
                         sizeof cfg->env.ref[i].text - 1, strlen(text));
    snprintf(cfg->env.ref[i].text, sizeof cfg->env.ref[i].text, "%s", text);
    return DT_OK;
}

/* Parses scalar `node` (after ${ENV} substitution) as the value of `k`; `path` names it and
 * `at` (its key, where there is one) locates errors about a value that is not a scalar. */
static dt_status apply_scalar(load_ctx *c, const key_def *k, const yaml_node_t *node, const yaml_node_t *at,
                              const char *path, int elem) {
    if (node->type != YAML_SCALAR_NODE) return fail_value(c, k, at, node, path, NULL, NULL, PV_BAD);
    const char *raw = node_text(node);
    if (strlen(raw) != node->data.scalar.length)
        return fail_node(c, node, path, "expected text without NUL characters, got a NUL at byte %zu of the value",
                         strlen(raw));
    int has_env = strstr(raw, "${") != NULL;
    DT_TRY(set_env_ref(c, node, path, has_env ? raw : NULL));
    if (has_env && c->no_env) { /* a saved config: keep the text; only a string can hold it */
        if (k->kind == K_STR && parse_value(k, c->cfg, raw, elem) != PV_OK) put_str(c->cfg, k->off, k->size, "");
        return DT_OK;
    }
    char *text;
    DT_TRY(expand_env(c, node, path, raw, &text));
    const char *s = (k->kind == K_STR && is_null_scalar(node)) ? "" : text;
    parse_result r = parse_value(k, c->cfg, s, elem);
    dt_status st = r == PV_OK ? DT_OK : fail_value(c, k, node, node, path, s, has_env ? raw : NULL, r);
    free(text);
    return st;
}

/* "data/hard.tsv.gz" -> "hard": a listed validation set's name */
static void file_stem(const char *path, char *out, size_t n) {
    const char *base = strrchr(path, '/');
    base = base && base[1] ? base + 1 : path;
    snprintf(out, n, "%s", base);
    char *dot = strchr(out, '.');
    if (dot && dot != out) *dot = '\0';
}

static int valid_set_name(const char *s) {
    if (!s[0] || strlen(s) >= 32) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.') return 0;
    return 1;
}

/* data.val_path as a YAML list of paths or a map name -> path (validation sets). */
static dt_status apply_val_sets(load_ctx *c, yaml_document_t *doc, const char *path, yaml_node_t *node,
                                const yaml_node_t *at) {
    dt_config *cfg = c->cfg;
    const int map = node->type == YAML_MAPPING_NODE;
    const int n = map ? (int)(node->data.mapping.pairs.top - node->data.mapping.pairs.start)
                      : (int)(node->data.sequence.items.top - node->data.sequence.items.start);
    if (n < 1 || n > DT_MAX_VAL_SETS)
        return fail_node(c, at, path, "expected 1 to %d validation sets, got %d", DT_MAX_VAL_SETS, n);
    for (int i = 0; i < n; i++) {
        yaml_node_t *kn = map ? yaml_document_get_node(doc, node->data.mapping.pairs.start[i].key) : NULL;
        yaml_node_t *vn = map ? yaml_document_get_node(doc, node->data.mapping.pairs.start[i].value)
                              : yaml_document_get_node(doc, node->data.sequence.items.start[i]);
        if (vn->type != YAML_SCALAR_NODE || strlen(node_text(vn)) != vn->data.scalar.length || !node_text(vn)[0])
            return fail_node(c, vn, path, "expected a non-empty path for each validation set, got %s",
                             vn->type == YAML_SCALAR_NODE ? "an empty one or one with a NUL" : node_kind_name(vn));
        const char *p = node_text(vn);
        if (strstr(p, "${"))
            return fail_node(c, vn, path, "${NAME} is read for a single data.val_path only, not in a list or map");
        if (strlen(p) >= DT_PATH_MAX)
            return fail_node(c, vn, path, "expected a path of at most %d bytes, got %zu", DT_PATH_MAX - 1, strlen(p));
        char name[DT_PATH_MAX];
        if (map && kn->type != YAML_SCALAR_NODE)
            return fail_node(c, kn, path, "expected a set name, got %s", node_kind_name(kn));
        if (map) snprintf(name, sizeof name, "%s", node_text(kn));
        else file_stem(p, name, sizeof name);
        quoted q;
        if (!valid_set_name(name))
            return fail_node(c, map ? kn : vn, path, "expected a set name of 1-31 letters, digits, '_', '-' or '.', "
                             "got \"%s\"%s", quote_line(name, &q), map ? "" : " (the file name; hint: name the sets: "
                             "val_path: {NAME: PATH, ...})");
        for (int j = 0; j < i; j++)
            if (strcmp(cfg->data.val_sets[j].name, name) == 0)
                return fail_node(c, map ? kn : vn, path, "two validation sets are named \"%s\" (hint: name them: "
                                 "val_path: {NAME: PATH, ...})", name);
        snprintf(cfg->data.val_sets[i].name, sizeof cfg->data.val_sets[i].name, "%s", name);
        snprintf(cfg->data.val_sets[i].path, sizeof cfg->data.val_sets[i].path, "%s", p);
    }
    cfg->data.n_val_sets = n;
    snprintf(cfg->data.val_path, sizeof cfg->data.val_path, "%s", cfg->data.val_sets[0].path);
    return set_env_ref(c, node, path, NULL);
}

/* Applies `node` as the value of `path` ("" = the root). `key` is the node of its key in the
 * file (NULL for the root and for overrides); messages about the value's shape point at it. */
static dt_status apply_node(load_ctx *c, yaml_document_t *doc, const char *path, yaml_node_t *node,
                            const yaml_node_t *key) {
    const yaml_node_t *at = key ? key : node;
    int idx = path[0] ? key_index(path) : -1;
    const key_def *k = idx >= 0 ? &keys[idx] : NULL;

    if (!k || k->kind == K_MAP) {
        if (k && is_null_scalar(node)) return DT_OK; /* `eval:` with nothing under it */
        if (node->type != YAML_MAPPING_NODE) {
            char hint[256];
            hint_suffix(k, hint, sizeof hint);
            quoted q;
            if (node->type == YAML_SCALAR_NODE)
                return fail_node(c, node, path, "expected a mapping, got \"%s\"%s", quote_line(node_text(node), &q),
                                 hint);
            return fail_node(c, at, path, "expected a mapping, got %s%s", node_kind_name(node), hint);
        }
        for (yaml_node_pair_t *pr = node->data.mapping.pairs.start; pr < node->data.mapping.pairs.top; pr++) {
            yaml_node_t *kn = yaml_document_get_node(doc, pr->key), *vn = yaml_document_get_node(doc, pr->value);
            if (kn->type != YAML_SCALAR_NODE)
                return fail_node(c, kn, path[0] ? path : NULL, "expected a key name, got %s", node_kind_name(kn));
            if (strlen(node_text(kn)) != kn->data.scalar.length)
                return fail_node(c, kn, path[0] ? path : NULL, "expected a key name, got one with a NUL character");
            char child[512];
            snprintf(child, sizeof child, "%s%s%s", path, path[0] ? "." : "", node_text(kn));
            for (yaml_node_pair_t *q = node->data.mapping.pairs.start; q < pr; q++) {
                yaml_node_t *qk = yaml_document_get_node(doc, q->key);
                if (qk->type == YAML_SCALAR_NODE && strcmp(node_text(qk), node_text(kn)) == 0)
                    return fail_node(c, kn, child, "duplicate key, first set at line %d",
                                     (int)qk->start_mark.line + 1);
            }
            if (key_index(child) < 0) return fail_unknown(c, kn, child);
            DT_TRY(apply_node(c, doc, child, vn, kn));
        }
        return DT_OK;
    }

    const int val_sets = strcmp(k->path, "data.val_path") == 0;
    if (val_sets && (node->type == YAML_SEQUENCE_NODE || node->type == YAML_MAPPING_NODE)) {
        DT_TRY(apply_val_sets(c, doc, path, node, at));
    } else if (k->kind == K_BETAS) {
        if (node->type != YAML_SEQUENCE_NODE) {
            if (node->type != YAML_SCALAR_NODE) return fail_value(c, k, at, node, path, NULL, NULL, PV_BAD);
            return fail_value(c, k, node, node, path, node_text(node), NULL, PV_BAD);
        }
        int n = (int)(node->data.sequence.items.top - node->data.sequence.items.start);
        if (n != 2) {
            char hint[256];
            hint_suffix(k, hint, sizeof hint);
            return fail_node(c, at, path, "expected a list of two numbers [beta1, beta2], got a list of %d%s", n,
                             hint);
        }
        for (int i = 0; i < 2; i++) {
            char elem[64];
            snprintf(elem, sizeof elem, "%s[%d]", path, i);
            yaml_node_t *item = yaml_document_get_node(doc, node->data.sequence.items.start[i]);
            if (item->type != YAML_SCALAR_NODE)
                return fail_node(c, item, elem, "expected a number in [0, 1), got %s", node_kind_name(item));
            DT_TRY(apply_scalar(c, k, item, item, elem, i));
        }
    } else if (k->kind == K_TARGETS && node->type == YAML_SEQUENCE_NODE) {
        const int n = (int)(node->data.sequence.items.top - node->data.sequence.items.start);
        if (n == 0) parse_value(k, c->cfg, "", 0); /* []: none named, PEFT's default */
        for (int i = 0; i < n; i++) {
            char elem[64];
            snprintf(elem, sizeof elem, "%s[%d]", path, i);
            yaml_node_t *item = yaml_document_get_node(doc, node->data.sequence.items.start[i]);
            if (item->type != YAML_SCALAR_NODE || !node_text(item)[0])
                return fail_value(c, k, item, item, elem, item->type == YAML_SCALAR_NODE ? "" : NULL, NULL, PV_BAD);
            DT_TRY(apply_scalar(c, k, item, item, elem, i));
        }
    } else {
        if (k->kind == K_TARGETS && node->type == YAML_SCALAR_NODE && !node_text(node)[0])
            return fail_value(c, k, at, node, path, "", NULL, PV_BAD);
        DT_TRY(apply_scalar(c, k, node, at, path, 0));
        if (val_sets) c->cfg->data.n_val_sets = 0; /* one path: the set "val" */
    }
    c->seen[idx].given = 1;
    c->seen[idx].line = node_line(c, at);
    c->seen[idx].ovr = c->cur_ovr;
    return DT_OK;
}

static dt_status yaml_fail(const load_ctx *c, const yaml_parser_t *parser, const char *path) {
    if (parser->error == YAML_MEMORY_ERROR) return dt_error_set(DT_ERR_NOMEM, "out of memory parsing YAML");
    int line = c->cur_ovr >= 0 ? 0 : (int)parser->problem_mark.line + 1;
    if (parser->error == YAML_READER_ERROR) { /* bad encoding: libyaml gives only the byte offset */
        size_t at = parser->problem_offset;
        if (c->cur_ovr < 0 && c->text) {
            line = 1;
            for (size_t i = 0; i < at && i < c->len; i++) line += c->text[i] == '\n';
        }
        char what[64] = "";
        if (parser->problem_value >= 0) snprintf(what, sizeof what, " (byte 0x%02x)", parser->problem_value & 0xff);
        return fail_at(c, line, c->cur_ovr, path, "YAML encoding error at byte offset %zu: %s%s", at,
                       parser->problem ? parser->problem : "invalid input", what);
    }
    return fail_at(c, line, c->cur_ovr, path, "YAML syntax error: %s",
                   parser->problem ? parser->problem : "invalid input");
}

/* One `--set key.path=value`. The value is taken verbatim as a plain scalar, unless it starts
 * like a YAML flow value ([ { " '), in which case libyaml parses it. */
static dt_status apply_override(load_ctx *c, int i) {
    const char *s = c->overrides[i];
    const char *eq = s ? strchr(s, '=') : NULL;
    c->cur_ovr = i;
    quoted q;
    if (!eq || eq == s) return fail_at(c, 0, i, NULL, "expected key.path=value, got \"%s\"", quote_line(s ? s : "", &q));
    char path[512];
    snprintf(path, sizeof path, "%.*s", (int)(eq - s), s);
    if (key_index(path) < 0) return fail_unknown(c, NULL, path);

    const char *value = eq + 1;
    long bad = utf8_bad_at(value);
    if (bad >= 0)
        return fail_at(c, 0, i, path, "expected UTF-8 text, got the byte 0x%02x at offset %ld of the value",
                       (unsigned char)value[bad], bad);
    yaml_document_t doc;
    dt_status st = DT_OK;
    if (strchr("[{\"'", value[0]) && value[0]) {
        yaml_parser_t parser;
        if (!yaml_parser_initialize(&parser)) return dt_error_set(DT_ERR_NOMEM, "out of memory parsing YAML");
        yaml_parser_set_input_string(&parser, (const unsigned char *)value, strlen(value));
        int ok = yaml_parser_load(&parser, &doc);
        if (!ok) st = yaml_fail(c, &parser, path);
        yaml_parser_delete(&parser);
        if (!ok) return st;
    } else {
        if (!yaml_document_initialize(&doc, NULL, NULL, NULL, 1, 1) ||
            !yaml_document_add_scalar(&doc, NULL, (yaml_char_t *)value, (int)strlen(value),
                                      YAML_PLAIN_SCALAR_STYLE)) {
            yaml_document_delete(&doc);
            return dt_error_set(DT_ERR_NOMEM, "out of memory parsing --set %s", s);
        }
    }
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (!root) st = fail_at(c, 0, i, path, "expected a value, got nothing");
    else st = apply_node(c, &doc, path, root, NULL);
    yaml_document_delete(&doc);
    return st;
}

/* ---- cross-field rules ------------------------------------------------------------------ */

static const char *bool_name(int b) { return b ? "true" : "false"; }

/* A key's value for a cross-field message: 4, or ${N} when it was set that way (the
 * substituted value is never shown); `got` quotes it as the value found. */
typedef struct {
    char s[sizeof(quoted) + 64];
} shown;
static const char *show_key(const dt_config *cfg, int idx, int got, shown *b) {
    char v[sizeof(quoted)];
    dt_config_shown(cfg, keys[idx].path, v, sizeof v);
    if (!got) snprintf(b->s, sizeof b->s, "%s", v);
    else snprintf(b->s, sizeof b->s, "\"%s\"%s", v, env_ref(cfg, keys[idx].path) ? " (after substituting the environment)" : "");
    return b->s;
}

/* model.init_from naming a Hugging Face directory (config.json + model.safetensors): the model
 * keys not given take config.json's values, a key given must agree with it, and data.tokenizer
 * not given is its tokenizer.json when it has one (but the byte tokenizer an export wrote). *n_pos_set: model.n_positions was taken
 * from it. A saved config.yaml holds all of these already (and the directory may be gone). */
static dt_status apply_init_dir(load_ctx *c, int *n_pos_set) {
    dt_config *cfg = c->cfg;
    *n_pos_set = 0;
    const int i_init = key_index("model.init_from");
    if (c->no_env || !cfg->model.init_from[0] || !dt_hf_is_dir(cfg->model.init_from)) return DT_OK;
    dt_hf_config hf;
    if (dt_hf_read_config(cfg->model.init_from, &hf) != DT_OK)
        return fail_key(c, i_init, "%s", dt_error_msg());
    char path[DT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/model.safetensors", cfg->model.init_from);
    if (access(path, F_OK) != 0)
        return fail_key(c, i_init, "%s has a config.json but no model.safetensors (dtrain reads safetensors weights; "
                        "a model.safetensors.index.json of shards or a pytorch_model.bin is not read)",
                        cfg->model.init_from);
    const int i_type = key_index("model.type");
    if (hf.shape.arch != cfg->model.shape.arch) {
        if (c->seen[i_type].given)
            return fail_key(c, i_type, "is %s but %s/config.json (model.init_from) has model_type \"%s\" (hint: leave "
                            "model.type out to take the architecture of model.init_from)", cfg->model.type,
                            cfg->model.init_from, dt_arch_hf_model_type(hf.shape.arch));
        put_str(cfg, keys[i_type].off, keys[i_type].size, dt_arch_name(hf.shape.arch));
        cfg->model.shape.arch = hf.shape.arch;
    }
    int nf;
    const dt_shape_field *f = dt_shape_fields(&nf);
    for (int k = 0; k < nf; k++) {
        const char *hf_key = f[k].hf[hf.shape.arch];
        char key[64], mine[32], theirs[32];
        snprintf(key, sizeof key, "model.%s", f[k].name);
        const int i = key_index(key);
        if (strcmp(f[k].name, "num_labels") == 0) continue; /* the config's (a language model becomes a classifier) */
        if (!hf_key) hf_key = f[k].name; /* qkv_bias: from model_type */
        dt_shape_str(&cfg->model.shape, &f[k], mine, sizeof mine);
        dt_shape_str(&hf.shape, &f[k], theirs, sizeof theirs);
        if (!c->seen[i].given) {
            dt_shape_set(&cfg->model.shape, &f[k], dt_shape_get(&hf.shape, &f[k]));
            if (strcmp(f[k].name, "n_positions") == 0) *n_pos_set = 1;
        } else if (strcmp(mine, theirs) != 0) {
            return fail_key(c, i, "is %s but %s/config.json (model.init_from) has %s: %s (hint: leave %s out to take "
                            "the shape of model.init_from)", mine, cfg->model.init_from, hf_key, theirs, key);
        }
    }
    if (*n_pos_set && cfg->model.shape.n_positions < cfg->data.seq_len)
        return fail_key(c, key_index("data.seq_len"), "expected at most %d, the positions of %s/config.json "
                        "(model.init_from: n_positions %d)", cfg->model.shape.n_positions, cfg->model.init_from,
                        cfg->model.shape.n_positions);
    snprintf(path, sizeof path, "%s/tokenizer.json", cfg->model.init_from);
    if (c->seen[key_index("data.tokenizer")].given) return DT_OK;
    if (access(path, F_OK) != 0) {
        if (cfg->model.shape.vocab_size > 257) /* not the byte tokenizer's model: bytes would index the wrong rows */
            return fail_key(c, i_init, "%s has no tokenizer.json, and its %d ids are not bytes (hint: set data.tokenizer "
                            "to the model's tokenizer.json)", cfg->model.init_from, cfg->model.shape.vocab_size);
        return DT_OK;
    }
    if (!dt_hf_is_byte_tokenizer(path)) /* dtrain's bytes stay bytes */
        snprintf(cfg->data.tokenizer, sizeof cfg->data.tokenizer, "%s", path);
    return DT_OK;
}

/* data.tokenizer_sha256: the SHA-256 of data.tokenizer's file ("" for bytes) when not given (or
 * given ""); given, the file must still have it (a run's config.yaml records the tokenizer the
 * model was trained with: export, predict, eval and generate of the run read it). A saved config
 * read back for comparison (no_env) is history: its file is not read. */
static dt_status check_tokenizer_sha(load_ctx *c) {
    dt_config *cfg = c->cfg;
    const int i_tok = key_index("data.tokenizer"), i_sha = key_index("data.tokenizer_sha256");
    const char *want = cfg->data.tokenizer_sha256;
    shown g;
    if (want[0] && (strlen(want) != 64 || strspn(want, "0123456789abcdef") != 64))
        return fail_key(c, i_sha, "expected 64 hexadecimal digits (a SHA-256) or \"\", got %s",
                        show_key(cfg, i_sha, 0, &g));
    if (c->no_env) return DT_OK;
    const int bytes = strcmp(cfg->data.tokenizer, "bytes") == 0;
    char got[65] = "";
    if (!bytes && dt_file_sha256(cfg->data.tokenizer, DT_ERR_CONFIG, got) != DT_OK)
        return fail_key(c, i_tok, "%s", dt_error_msg());
    if (want[0] && bytes)
        return fail_key(c, i_sha, "the model was trained with the tokenizer of SHA-256 %s, but data.tokenizer is bytes "
                        "(hint: set data.tokenizer to that tokenizer.json, or --set data.tokenizer_sha256= to read "
                        "bytes)", want);
    if (want[0] && strcmp(want, got) != 0)
        return fail_key(c, i_sha, "the model was trained with the tokenizer of SHA-256 %s, but data.tokenizer %s has "
                        "%s: the file changed since (hint: restore it, or --set data.tokenizer_sha256= to take it as "
                        "it is now)", want, cfg->data.tokenizer, got);
    memcpy(cfg->data.tokenizer_sha256, got, sizeof got);
    return DT_OK;
}

/* model.lora: targets the architecture has (its PEFT default when none are named: [] or left
 * out), and none named without a rank. */
static dt_status validate_lora(load_ctx *c) {
    dt_config *cfg = c->cfg;
    dt_lora *lo = &cfg->model.lora;
    const dt_arch a = cfg->model.shape.arch;
    const int i_targets = key_index("model.lora.targets");
    const unsigned have = dt_lora_arch_targets(a);
    char names[256], valid[256];
    const int i_init = key_index("model.lora.init_from");
    const char *init = cfg->model.lora_init_from;
    if (lo->rank == 0) {
        if (lo->targets || init[0] || lo->base_bf16)
            return fail_key(c, lo->targets ? i_targets : init[0] ? i_init : key_index("model.lora.base_dtype"),
                            "is given, but model.lora.rank is 0: no LoRA (hint: set model.lora.rank, e.g. 8, or leave "
                            "model.lora out)");
        return DT_OK;
    }
    if (lo->base_bf16 && cfg->training.device == DT_DEVICE_CUDA && cfg->training.precision == DT_PREC_FP32)
        return fail_key(c, key_index("model.lora.base_dtype"), "is bf16, which needs bf16 products on cuda, but "
                        "training.precision is fp32 (hint: training.precision: bf16 or auto, or model.lora.base_dtype: "
                        "fp32)");
    if (!lo->targets) lo->targets = dt_lora_default_targets(a);
    if (lo->targets & ~have)
        return fail_key(c, i_targets, "names %s, which model.type %s does not have (its projections: %s)",
                        dt_lora_targets_str(lo->targets & ~have, names, sizeof names), cfg->model.type,
                        dt_lora_targets_str(have, valid, sizeof valid));
    if (init[0] && !c->no_env) { /* a PEFT directory: its adapters must be these */
        struct stat sb;
        char dir_cfg[DT_PATH_MAX + 32];
        snprintf(dir_cfg, sizeof dir_cfg, "%s/adapter_config.json", init);
        if (stat(init, &sb) == 0 && S_ISDIR(sb.st_mode)) {
            dt_lora peft;
            if (dt_hf_read_adapter_config(init, a, &peft) != DT_OK) {
                dt_error_prefix(keys[i_init].path);
                return DT_ERR_CONFIG;
            }
            if (peft.rank != lo->rank || peft.alpha != lo->alpha || peft.targets != lo->targets)
                return fail_key(c, i_init, "%s has r %d, lora_alpha %g, target_modules %s; model.lora has rank %d, alpha "
                                "%g, targets [%s] (hint: set model.lora.rank, alpha and targets to the adapters')",
                                dir_cfg, peft.rank, peft.alpha, dt_lora_targets_str(peft.targets, names, sizeof names),
                                lo->rank, lo->alpha, dt_lora_targets_str(lo->targets, valid, sizeof valid));
        }
    }
    return DT_OK;
}

/* The model keys of another architecture keep their defaults; the Llama family's shape holds
 * together (the MLP's width given, whole key/value head groups, an even head size). */
static dt_status validate_shape(load_ctx *c) {
    dt_config *cfg = c->cfg;
    dt_model_shape *sh = &cfg->model.shape;
    int nf;
    const dt_shape_field *f = dt_shape_fields(&nf);
    char key[64], v[32];
    for (int k = 0; k < nf; k++) {
        snprintf(key, sizeof key, "model.%s", f[k].name);
        if ((f[k].archs >> sh->arch) & 1u || dt_shape_get(sh, &f[k]) == dt_shape_default(&f[k])) continue;
        return fail_key(c, key_index(key), "applies to model.type llama, not %s (hint: leave it out, or set "
                        "model.type: llama)", cfg->model.type);
    }
    if (sh->arch != DT_ARCH_LLAMA) return DT_OK;
    const int nkv = dt_shape_kv_heads(sh), hs = dt_shape_head_dim(sh);
    if (sh->intermediate_size < 1)
        return fail_key(c, key_index("model.intermediate_size"), "expected the SwiGLU MLP's width, an integer >= 1, for "
                        "model.type llama, got %s", dt_config_shown(cfg, "model.intermediate_size", v, sizeof v));
    if (nkv > sh->n_head || sh->n_head % nkv != 0)
        return fail_key(c, key_index("model.num_key_value_heads"), "expected a divisor of model.n_head (%d), got %d "
                        "(each key/value head serves a group of query heads)", sh->n_head, nkv);
    if (hs < 2 || hs % 2 || hs > 1024)
        return fail_key(c, key_index(sh->head_dim ? "model.head_dim" : "model.n_embd"), "expected a head size "
                        "(model.head_dim, else n_embd / n_head) that is even and at most 1024 (rotary positions turn "
                        "pairs), got %d", hs);
    if (sh->rope_scaling_factor > 0 && sh->rope_scaling_factor < 1)
        return fail_key(c, key_index("model.rope_scaling.factor"), "expected 0 (RoPE not scaled) or at least 1 (Llama "
                        "3.1's scaling), got %s", dt_config_shown(cfg, "model.rope_scaling.factor", v, sizeof v));
    if (sh->rope_scaling_factor > 0 && !(sh->rope_high_freq_factor > sh->rope_low_freq_factor))
        return fail_key(c, key_index("model.rope_scaling.high_freq_factor"), "expected more than model.rope_scaling.low_freq_factor "
                        "(%g), got %s", sh->rope_low_freq_factor,
                        dt_config_shown(cfg, "model.rope_scaling.high_freq_factor", v, sizeof v));
    return DT_OK;
}

/* training.tensor_parallel T and pipeline_parallel P: num_workers = D x P x T, each layer
 * splits into T equal shares of whole heads (key/value heads too) and MLP columns, and the
 * layers into P stages of at least one. What is not built yet is refused by name rather than
 * run some other way. */
const char *dt_config_mesh_problem(const dt_config *cfg, const char **key, char *buf, size_t n) {
    const dt_model_shape *sh = &cfg->model.shape;
    const int T = cfg->training.tensor_parallel, P = cfg->training.pipeline_parallel;
#define WHY(...) (snprintf(buf, n, __VA_ARGS__), buf)
    *key = "training.pipeline_parallel";
    if (P > 1 && cfg->training.num_workers % (T * P) != 0)
        return WHY("expected a divisor of training.num_workers (%d) / tensor_parallel (%d), got %d (num_workers = "
                   "data-parallel replicas x pipeline_parallel x tensor_parallel)", cfg->training.num_workers, T, P);
    if (P > sh->n_layer)
        return WHY("expected at most model.n_layer (%d), got %d (each stage runs at least one layer)", sh->n_layer, P);
    *key = "training.tensor_parallel";
    if (T == 1) return NULL;
    if (cfg->training.num_workers % (T * P) != 0)
        return WHY("expected a divisor of training.num_workers (%d), got %d (num_workers = data-parallel replicas x "
                   "pipeline_parallel x tensor_parallel)", cfg->training.num_workers, T);
    if (sh->vocab_size < T)
        return WHY("expected at most model.vocab_size (%d), got %d (each worker takes at least one row of the "
                   "vocabulary)", sh->vocab_size, T);
    if (sh->n_head % T != 0)
        return WHY("expected a divisor of model.n_head (%d), got %d (each worker takes whole attention heads)",
                   sh->n_head, T);
    if (sh->arch == DT_ARCH_LLAMA && dt_shape_kv_heads(sh) % T != 0)
        return WHY("expected a divisor of model.num_key_value_heads (%d), got %d (each worker takes whole key/value "
                   "heads)", dt_shape_kv_heads(sh), T);
    if (sh->arch == DT_ARCH_LLAMA && sh->intermediate_size % T != 0)
        return WHY("expected a divisor of model.intermediate_size (%d), got %d (each worker takes an equal share of "
                   "the MLP)", sh->intermediate_size, T);
#undef WHY
    return NULL;
}

static dt_status validate_mesh(load_ctx *c) {
    const char *key;
    char why[512];
    if (!dt_config_mesh_problem(c->cfg, &key, why, sizeof why)) return DT_OK;
    return fail_key(c, key_index(key), "%s", why);
}

/* The keys that act on evaluations and samples need what they act on. */
static dt_status validate_eval_keys(load_ctx *c) {
    const dt_config *cfg = c->cfg;
    const int i_best = key_index("checkpoint.best_metric"), i_pat = key_index("training.early_stopping_patience"),
              i_samp = key_index("logging.sample_every_steps");
    const int cls = cfg->model.shape.num_labels >= 2;
    if (cfg->checkpoint.best_metric != DT_BEST_NONE && !cfg->data.val_path[0])
        return fail_key(c, i_best, "needs validation data to compare checkpoints by (hint: set data.val_path)");
    if (cfg->checkpoint.best_metric == DT_BEST_F1 && !cls)
        return fail_key(c, i_best, "expected none, val_loss or val_accuracy for a language model, got \"val_f1\" "
                                   "(macro-F1 is a classification score)");
    if (cfg->training.early_stopping_patience > 0 && (!cfg->data.val_path[0] || cfg->eval.every_steps == 0))
        return fail_key(c, i_pat, "needs evaluations during training to count (hint: set data.val_path and "
                                  "eval.every_steps > 0)");
    if (cfg->logging.sample_every_steps > 0 && cls)
        return fail_key(c, i_samp, "expected 0 for a classifier (model.num_labels: %d): samples are generated text "
                                   "(hint: dtrain predict shows a classifier's labels)", cfg->model.shape.num_labels);
    if (cfg->logging.sample_every_steps > 0 && !cfg->logging.sample_prompt[0] &&
        strcmp(cfg->data.tokenizer, "bytes") == 0)
        return fail_key(c, i_samp, "needs logging.sample_prompt with the byte tokenizer (it has no end-of-text token "
                                   "to start from)");
    return DT_OK;
}

/* Chat and prompt/completion data train a language model on the model's own BPE tokenizer. */
static dt_status validate_sft_keys(load_ctx *c) {
    const dt_config *cfg = c->cfg;
    const int i_fmt = key_index("data.format"), i_on = key_index("data.train_on"), i_pack = key_index("data.packing");
    const int sft = cfg->data.format == DT_FORMAT_CHAT || cfg->data.format == DT_FORMAT_COMPLETION;
    const char *fmt = cfg->data.format == DT_FORMAT_CHAT ? "chat" : "completion";
    if (!sft && cfg->data.train_on_all) /* its default, assistant, is in every saved config.yaml */
        return fail_key(c, i_on, "applies to data.format chat and completion (the loss on the answer only)");
    if (!sft && cfg->data.packing)
        return fail_key(c, i_pack, "applies to data.format chat and completion (examples shorter than data.seq_len, "
                        "several to a row); token shards have no padding to save");
    if (sft && cfg->model.shape.num_labels != 0)
        return fail_key(c, i_fmt, "%s trains a language model, but model.num_labels is %d (hint: model.num_labels: "
                        "0)", fmt, cfg->model.shape.num_labels);
    if (sft && strcmp(cfg->data.tokenizer, "bytes") == 0)
        return fail_key(c, i_fmt, "%s needs the model's BPE tokenizer, but data.tokenizer is bytes (hint: "
                        "model.init_from a Hugging Face directory with its tokenizer.json, or data.tokenizer: "
                        "DIR/tokenizer.json%s)", fmt, cfg->data.format == DT_FORMAT_CHAT ? " beside the "
                        "tokenizer_config.json that holds the chat template" : "");
    return DT_OK;
}

static dt_status validate(load_ctx *c) {
    dt_config *cfg = c->cfg;
    int i_train = key_index("data.train_path"),
        i_dev = key_index("training.device"), i_res = key_index("training.resources_per_worker.gpu"),
        i_comm = key_index("training.communication_backend"),
        i_labels = key_index("model.num_labels"), i_vocab = key_index("model.vocab_size"),
        i_embd = key_index("model.n_embd"), i_head = key_index("model.n_head"),
        i_pos = key_index("model.n_positions"), i_dir = key_index("run.dir");
    shown g, o;

    if (dt_arch_parse(cfg->model.type, &cfg->model.shape.arch) != DT_OK) /* K_NAME holds one of its spellings */
        return fail_key(c, key_index("model.type"), "names no architecture (internal)");
    int n_pos_from_init = 0;
    DT_TRY(apply_init_dir(c, &n_pos_from_init));
    DT_TRY(check_tokenizer_sha(c));
    if (!cfg->data.train_path[0])
        return fail_at(c, 0, -1, keys[i_train].path,
                       "required key is missing (hint: add train_path under data:, or pass "
                       "--set data.train_path=PATH)");

    if (cfg->training.use_gpu >= 0) {
        dt_device_kind want = cfg->training.use_gpu ? DT_DEVICE_CUDA : DT_DEVICE_CPU;
        if (cfg->training.device != DT_DEVICE_AUTO && cfg->training.device != want)
            return fail_key(c, i_dev,
                            "expected %s or auto with training.use_gpu: %s, got \"%s\" (hint: keep only one "
                            "of training.use_gpu and training.device)",
                            dt_device_name(want), bool_name(cfg->training.use_gpu),
                            dt_device_name(cfg->training.device));
        cfg->training.device = want;
    }
    if (cfg->training.device == DT_DEVICE_CUDA && cfg->training.gpus_per_worker != 1)
        return fail_key(c, i_res, "expected 1 when training.device is cuda, got %s (hint: one GPU per worker)",
                        show_key(cfg, i_res, 1, &g));
    if (cfg->training.device == DT_DEVICE_CPU && cfg->training.comm == DT_COMM_NCCL)
        return fail_key(c, i_comm, "expected collective, auto, shm, mpi or tcp when training.device is cpu, got \"nccl\" "
                                   "(hint: NCCL needs GPUs)");

    if (cfg->model.shape.num_labels == 1)
        return fail_key(c, i_labels, "expected 0 (language modelling) or an integer >= 2 (classification), got "
                                     "\"1\"");
    if (cfg->model.shape.num_labels >= 2 && cfg->model.shape.vocab_size < 257)
        return fail_key(c, i_vocab,
                        "expected an integer >= 257 when model.num_labels >= 2, got %s (hint: classification "
                        "uses the byte tokenizer: 256 byte ids + <cls>)",
                        show_key(cfg, i_vocab, 1, &g));
    DT_TRY(validate_shape(c));
    DT_TRY(validate_lora(c));
    if (cfg->model.shape.n_embd % cfg->model.shape.n_head != 0 && cfg->model.shape.head_dim == 0) {
        if (c->seen[i_embd].given)
            return fail_key(c, i_embd, "expected a multiple of model.n_head (%s), got %s", show_key(cfg, i_head, 0, &o),
                            show_key(cfg, i_embd, 1, &g));
        return fail_key(c, i_head, "expected a divisor of model.n_embd (%s), got %s", show_key(cfg, i_embd, 0, &o),
                        show_key(cfg, i_head, 1, &g));
    }
    if (!c->seen[i_pos].given && !n_pos_from_init) cfg->model.shape.n_positions = cfg->data.seq_len;
    else if (cfg->model.shape.n_positions < cfg->data.seq_len)
        return fail_key(c, i_pos, "expected an integer >= data.seq_len (%s), got %s",
                        show_key(cfg, key_index("data.seq_len"), 0, &o), show_key(cfg, i_pos, 1, &g));

    DT_TRY(validate_eval_keys(c));
    DT_TRY(validate_sft_keys(c));
    DT_TRY(validate_mesh(c));

    if (!c->seen[i_dir].given) {
        const char *base = strrchr(c->name, '/');
        base = base ? base + 1 : c->name;
        const char *dot = strrchr(base, '.');
        int stem = dot && dot != base ? (int)(dot - base) : (int)strlen(base);
        char dir[DT_PATH_MAX];
        snprintf(dir, sizeof dir, "runs/%.*s", stem, base);
        if (utf8_bad_at(dir) >= 0) /* a saved config.yaml could not hold it */
            return fail_at(c, 0, -1, keys[i_dir].path, "expected to default to runs/<config name>, but the config's "
                                                        "file name is not UTF-8 text (hint: set run.dir)");
        put_str(cfg, keys[i_dir].off, keys[i_dir].size, dir);
    }
    return DT_OK;
}

/* ---- public API ------------------------------------------------------------------------- */

const char *dt_device_name(dt_device_kind d) { return enum_canonical(device_names, (int)d); }

dt_status dt_device_parse(const char *name, dt_device_kind *out) {
    for (const enum_name *e = device_names; e->name; e++)
        if (strcmp(e->name, name) == 0) {
            *out = (dt_device_kind)e->value;
            return DT_OK;
        }
    return DT_ERR_USAGE;
}

void dt_config_defaults(dt_config *cfg) {
    memset(cfg, 0, sizeof *cfg);
    for (int i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        if (k->kind == K_MAP) continue;
        if (k->kind == K_TRIBOOL) {
            put_int(cfg, k->off, -1);
        } else if (k->kind == K_BETAS) {
            char b1[32];
            const char *sp = strchr(k->def, ' ');
            snprintf(b1, sizeof b1, "%.*s", (int)(sp - k->def), k->def);
            parse_value(k, cfg, b1, 0);
            parse_value(k, cfg, sp + 1, 1);
        } else if (k->kind == K_STR) {
            put_str(cfg, k->off, k->size, k->def);
        } else {
            parse_value(k, cfg, k->def, 0);
        }
    }
}

static dt_status load_text(dt_config *cfg, const char *name, const char *yaml, size_t len,
                           const char *const *overrides, int n_overrides, int no_env) {
    load_ctx c;
    memset(&c, 0, sizeof c);
    c.cfg = cfg;
    c.text = yaml;
    c.len = yaml ? len : 0;
    c.no_env = no_env;
    c.name = name ? name : "<config>";
    c.overrides = overrides;
    c.cur_ovr = -1;
    dt_config_defaults(cfg);

    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) return dt_error_set(DT_ERR_NOMEM, "out of memory parsing YAML");
    yaml_parser_set_input_string(&parser, (const unsigned char *)(yaml ? yaml : ""), yaml ? len : 0);
    if (!yaml_parser_load(&parser, &doc)) {
        dt_status st = yaml_fail(&c, &parser, NULL);
        yaml_parser_delete(&parser);
        return st;
    }
    dt_status st = DT_OK;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    yaml_document_t doc2;
    if (!root || is_null_scalar(root)) {
        st = fail_at(&c, 0, -1, NULL, "expected a mapping of sections like training: and data:, got an empty "
                                      "document");
    } else if (root->type != YAML_MAPPING_NODE) {
        st = fail_node(&c, root, NULL, "expected a mapping of sections like training: and data:, got %s%s%s",
                       root->type == YAML_SCALAR_NODE ? "\"" : "",
                       root->type == YAML_SCALAR_NODE ? node_text(root) : node_kind_name(root),
                       root->type == YAML_SCALAR_NODE ? "\"" : "");
    } else if (!yaml_parser_load(&parser, &doc2)) {
        st = yaml_fail(&c, &parser, NULL);
    } else {
        yaml_node_t *root2 = yaml_document_get_root_node(&doc2);
        if (root2)
            st = fail_node(&c, root2, NULL, "expected a single YAML document, got a second one (hint: remove the "
                                            "\"---\" line)");
        yaml_document_delete(&doc2);
        if (st == DT_OK) st = apply_node(&c, &doc, "", root, NULL);
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    if (st != DT_OK) return st;

    for (int i = 0; i < n_overrides; i++) DT_TRY(apply_override(&c, i));
    c.cur_ovr = -1;
    DT_TRY(validate(&c));
    record_env_values(cfg);
    return DT_OK;
}

dt_status dt_config_load_string(dt_config *cfg, const char *name, const char *yaml,
                                const char *const *overrides, int n_overrides) {
    dt_status st = load_text(cfg, name, yaml, yaml ? strlen(yaml) : 0, overrides, n_overrides, 0);
    if (st == DT_OK) cfg->source[0] = '\0';
    return st;
}

static dt_status load_file(dt_config *cfg, const char *path, const char *const *overrides, int n_overrides,
                           int no_env) {
    int fd; /* a FIFO, a device or a directory is refused at once (a FIFO would block in open()) */
    dt_status ost = dt_file_open_regular(path, DT_ERR_CONFIG, &fd);
    if (ost != DT_OK) return DT_ERR_IO; /* "PATH: cannot open: REASON", "PATH: not a regular file (a FIFO)" */
    FILE *f = dt_file_stream(fd, "rb", path);
    if (!f) return DT_ERR_NOMEM;
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        return dt_error_set(DT_ERR_NOMEM, "out of memory reading %s", path);
    }
    for (;;) {
        if (len == cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                fclose(f);
                return dt_error_set(DT_ERR_NOMEM, "out of memory reading %s", path);
            }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    if (ferror(f)) {
        int err = errno;
        free(buf);
        fclose(f);
        return dt_error_set(DT_ERR_IO, "%s: cannot read config file: %s", path, strerror(err));
    }
    fclose(f);
    dt_status st = load_text(cfg, path, buf, len, overrides, n_overrides, no_env);
    free(buf);
    if (st == DT_OK) snprintf(cfg->source, sizeof cfg->source, "%s", path);
    return st;
}

dt_status dt_config_load(dt_config *cfg, const char *path, const char *const *overrides, int n_overrides) {
    return load_file(cfg, path, overrides, n_overrides, 0);
}

dt_status dt_config_load_saved(dt_config *cfg, const char *path) { return load_file(cfg, path, NULL, 0, 1); }

/* ---- printing ----------------------------------------------------------------------------- */

/* A YAML double-quoted string that reads back as `s`: besides ASCII controls, the characters
 * YAML would not take as they are — its line breaks beyond ASCII (U+0085, U+2028, U+2029,
 * read as a space) and the other C1 controls, the BOM and U+FFFE/U+FFFF (not printable) — are
 * escaped. */
static void print_quoted(FILE *out, const char *s) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(out, "\\%c", *p);
        else if (*p == '\n') fputs("\\n", out);
        else if (*p == '\t') fputs("\\t", out);
        else if (*p < 0x20 || *p == 0x7f) fprintf(out, "\\x%02x", *p);
        else if (p[0] == 0xc2 && p[1] >= 0x80 && p[1] <= 0x9f) {
            if (p[1] == 0x85) fputs("\\N", out);
            else fprintf(out, "\\x%02x", p[1]);
            p++;
        } else if (p[0] == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9)) {
            fputs(p[2] == 0xa8 ? "\\L" : "\\P", out);
            p += 2;
        } else if (p[0] == 0xef && ((p[1] == 0xbb && p[2] == 0xbf) || (p[1] == 0xbf && p[2] >= 0xbe))) {
            fprintf(out, "\\u%s", p[1] == 0xbb ? "FEFF" : p[2] == 0xbe ? "FFFE" : "FFFF");
            p += 2;
        } else fputc(*p, out);
    }
    fputc('"', out);
}

/* The shortest %g form that reads back as the same double. */
static void print_double(FILE *out, double v) {
    char buf[64];
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) break;
    }
    fputs(buf, out);
}

/* One key's value as dt_config_print writes it; `written`: a key set with ${NAME} as given. */
static void print_value(FILE *out, const dt_config *cfg, const key_def *k, int written) {
    const char *field = (const char *)cfg + k->off;
    const char *ref = written ? env_ref_live(cfg, k->path) : NULL;
    if (ref) {
        print_quoted(out, ref);
        return;
    }
    int iv;
    switch (k->kind) {
    case K_MAP: break;
    case K_INT:
    case K_ENUM:
    case K_BOOL:
    case K_TRIBOOL:
        memcpy(&iv, field, sizeof iv);
        if (k->kind == K_INT) fprintf(out, "%d", iv);
        else if (k->kind == K_ENUM) fputs(enum_canonical(k->names, iv), out);
        else fputs(bool_name(iv), out);
        break;
    case K_LONG: {
        long lv;
        memcpy(&lv, field, sizeof lv);
        fprintf(out, "%ld", lv);
        break;
    }
    case K_U64: {
        uint64_t u;
        memcpy(&u, field, sizeof u);
        fprintf(out, "%" PRIu64, u);
        break;
    }
    case K_DOUBLE: {
        double d;
        memcpy(&d, field, sizeof d);
        print_double(out, d);
        break;
    }
    case K_BETAS: {
        double b1, b2;
        memcpy(&b1, field, sizeof b1);
        memcpy(&b2, (const char *)cfg + k->off2, sizeof b2);
        char elem[80];
        fputc('[', out);
        for (int i = 0; i < 2; i++) {
            snprintf(elem, sizeof elem, "%s[%d]", k->path, i);
            if (i) fputs(", ", out);
            if (written && (ref = env_ref_live(cfg, elem)) != NULL) print_quoted(out, ref);
            else print_double(out, i ? b2 : b1);
        }
        fputc(']', out);
        break;
    }
    case K_STR:
        if (strcmp(k->path, "data.val_path") == 0 && cfg->data.n_val_sets > 0) { /* a flow map, read back as such */
            fputc('{', out);
            for (int i = 0; i < cfg->data.n_val_sets; i++) {
                fputs(i ? ", " : "", out);
                print_quoted(out, cfg->data.val_sets[i].name); /* "null", "1.5": strings to any YAML reader */
                fputs(": ", out);
                print_quoted(out, cfg->data.val_sets[i].path);
            }
            fputc('}', out);
            break;
        }
        print_quoted(out, field);
        break;
    case K_NAME: print_quoted(out, field); break;
    case K_TARGETS: {
        unsigned mask;
        char names[256];
        memcpy(&mask, field, sizeof mask);
        fprintf(out, "[%s]", dt_lora_targets_str(mask, names, sizeof names));
        break;
    }
    case K_RESUME:
        memcpy(&iv, field, sizeof iv);
        if (iv == DT_RESUME_PATH) print_quoted(out, (const char *)cfg + k->off2);
        else fputs(iv == DT_RESUME_NEVER ? "never" : "auto", out);
        break;
    }
}

void dt_config_print(const dt_config *cfg, FILE *out) {
    const char *prev = "";
    quoted_name qn; /* a comment line: nothing in the name may end it or break the encoding */
    if (cfg->source[0]) fprintf(out, "# resolved from %s\n", quote_name(cfg->source, &qn));
    for (int i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        const char *field = (const char *)cfg + k->off;
        int iv;
        if (k->kind == K_MAP) continue;
        if (k->kind == K_TRIBOOL) {
            memcpy(&iv, field, sizeof iv);
            if (iv < 0) continue; /* use_gpu not given: the resolved device says it all */
        }
        /* open the mappings this key is in that the previous key was not in */
        int depth = 0;
        const char *p = k->path, *q = prev;
        for (;;) {
            const char *dot = strchr(p, '.');
            if (!dot) break;
            size_t n = (size_t)(dot - p);
            int same = q && strncmp(p, q, n) == 0 && q[n] == '.';
            if (!same) fprintf(out, "%*s%.*s:\n", 2 * depth, "", (int)n, p);
            q = same ? q + n + 1 : NULL;
            p = dot + 1;
            depth++;
        }
        fprintf(out, "%*s%s: ", 2 * depth, "", p);
        prev = k->path;
        print_value(out, cfg, k, 1);
        fputc('\n', out);
    }
}

/* A key's printed value in buf ("" for mappings and an unset use_gpu); `written` as for
 * print_value. */
static void value_string(const dt_config *cfg, const key_def *k, int written, char *buf, size_t n) {
    buf[0] = '\0';
    int iv;
    if (k->kind == K_MAP) return;
    memcpy(&iv, (const char *)cfg + k->off, sizeof iv);
    if (k->kind == K_TRIBOOL && iv < 0) return;
    FILE *f = fmemopen(buf, n, "w");
    if (!f) return;
    print_value(f, cfg, k, written);
    fclose(f);
    buf[n - 1] = '\0';
}

/* Key `path`'s value as printed ("optimizer.betas[1]": that element). */
static void current_value(const dt_config *cfg, const char *path, char *buf, size_t n) {
    char key[80];
    snprintf(key, sizeof key, "%s", path);
    char *br = strchr(key, '[');
    int elem = br ? br[1] - '0' : -1;
    if (br) *br = '\0';
    int idx = key_index(key);
    buf[0] = '\0';
    if (idx < 0) return;
    if (elem < 0 || keys[idx].kind != K_BETAS) {
        value_string(cfg, &keys[idx], 0, buf, n);
        return;
    }
    double v;
    memcpy(&v, (const char *)cfg + (elem ? keys[idx].off2 : keys[idx].off), sizeof v);
    FILE *f = fmemopen(buf, n, "w");
    if (!f) return;
    print_double(f, v);
    fclose(f);
    buf[n - 1] = '\0';
}

/* Every ${NAME} key's value now: printing shows the text as written only while it is unchanged. */
static void record_env_values(dt_config *cfg) {
    for (int i = 0; i < cfg->env.n; i++)
        current_value(cfg, cfg->env.ref[i].key, cfg->env.ref[i].value, sizeof cfg->env.ref[i].value);
}

const char *dt_config_shown(const dt_config *cfg, const char *path, char *buf, size_t n) {
    const char *ref = env_ref_live(cfg, path);
    if (ref) {
        quoted q;
        snprintf(buf, n, "%s", quote_line(ref, &q));
    } else {
        current_value(cfg, path, buf, n);
    }
    return buf;
}

/* room for any key's printed value: a data.val_path map of DT_MAX_VAL_SETS quoted paths */
#define VALUE_MAX (DT_MAX_VAL_SETS * (2 * DT_PATH_MAX + 48))

/* data.tokenizer_sha256 empty (the byte tokenizer, or a config saved before it was recorded):
 * nothing to digest or compare, so that a byte config keeps the digest it always had */
static int no_tokenizer_sha(const key_def *k, const char *value) {
    return !value[0] && strcmp(k->path, "data.tokenizer_sha256") == 0;
}

uint32_t dt_config_digest(const dt_config *cfg) {
    uLong crc = crc32(0L, Z_NULL, 0);
    char v[VALUE_MAX];
    for (int i = 0; i < N_KEYS; i++) {
        value_string(cfg, &keys[i], 0, v, sizeof v);
        if (no_tokenizer_sha(&keys[i], cfg->data.tokenizer_sha256)) continue;
        crc = crc32(crc, (const Bytef *)keys[i].path, (uInt)strlen(keys[i].path) + 1);
        crc = crc32(crc, (const Bytef *)v, (uInt)strlen(v) + 1);
    }
    return (uint32_t)crc;
}

int dt_config_diff(const dt_config *a, const dt_config *b, char *buf, size_t n) {
    return dt_config_diff_except(a, b, NULL, buf, n);
}

int dt_config_diff_except(const dt_config *a, const dt_config *b, const char *skip, char *buf, size_t n) {
    char va[VALUE_MAX], vb[VALUE_MAX];
    int count = 0;
    size_t k = 0;
    if (n) buf[0] = '\0';
    for (int i = 0; i < N_KEYS; i++) {
        if (skip && strcmp(keys[i].path, skip) == 0) continue;
        value_string(a, &keys[i], 1, va, sizeof va);
        value_string(b, &keys[i], 1, vb, sizeof vb);
        if (strcmp(va, vb) == 0 || no_tokenizer_sha(&keys[i], a->data.tokenizer_sha256) ||
            no_tokenizer_sha(&keys[i], b->data.tokenizer_sha256))
            continue;
        count++;
        if (k < n) {
            int w = snprintf(buf + k, n - k, "%s%s %s -> %s", k ? ", " : "", keys[i].path, va[0] ? va : "(unset)",
                             vb[0] ? vb : "(unset)");
            if (w > 0) k += (size_t)w;
        }
    }
    return count;
}
