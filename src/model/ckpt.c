/* ckpt.c — checkpoints: atomic, checksummed, global (include/dtrain/ckpt.h). */
#include "dtrain/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "dtrain/file.h"
#include "dtrain/jsonfile.h"
#include "dtrain/safetensors.h"

#define CKPT_FORMAT "dtrain-checkpoint"
#define CKPT_VERSION 1
#define PATH_LEN (DT_PATH_MAX + 128)

/* the files of a checkpoint, in the order they are written; the manifest comes last */
static const char *const ckpt_files[] = {"model.safetensors", "optimizer.safetensors", "trainer.json", "config.yaml"};
enum { N_FILES = sizeof ckpt_files / sizeof ckpt_files[0] };

/* ------------------------------------------------------------------ files */

static dt_status fsync_path(const char *path, int dir) {
    int fd = open(path, dir ? (O_RDONLY | O_DIRECTORY) : O_RDONLY);
    if (fd < 0) return dt_error_set(DT_ERR_IO, "%s: cannot open to fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0) return dt_error_set(DT_ERR_IO, "%s: fsync failed: %s", path, strerror(e));
    return DT_OK;
}

/* CRC32 (zlib) and size of a whole file (a regular file: a FIFO or a device is refused). */
static dt_status crc_file(const char *path, uint32_t *crc_out, uint64_t *bytes_out) {
    int fd;
    DT_TRY(dt_file_open_regular(path, DT_ERR_DATA, &fd)); /* missing or not a file: bad data; EIO, EMFILE: I/O */
    static unsigned char buf[1 << 20];
    uLong crc = crc32(0L, Z_NULL, 0);
    uint64_t total = 0;
    ssize_t got;
    while ((got = read(fd, buf, sizeof buf)) != 0) {
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) break;
        crc = crc32_z(crc, buf, (size_t)got);
        total += (uint64_t)got;
    }
    int e = errno;
    close(fd);
    if (got < 0) return dt_error_set(DT_ERR_IO, "%s: read error: %s", path, strerror(e));
    *crc_out = (uint32_t)crc;
    *bytes_out = total;
    return DT_OK;
}

/* Writes `text` to path, a new file (never through a link planted there), and fsyncs it. */
static dt_status write_file_synced(const char *path, const char *text) {
    return dt_file_write_new(path, text, strlen(text));
}


/* Removes the entry `name` of the directory rfd (path `root`, for messages): a checkpoint
 * directory and the files in it. Nothing is followed: a symbolic link (or any other
 * non-directory) where a checkpoint directory is expected is removed itself, its target
 * untouched; the files are unlinked through the directory's own descriptor (a link among
 * them goes, not what it points to); a subdirectory (checkpoints have none) is left, and
 * so the directory, with an error. A missing entry is DT_OK. */
static dt_status remove_at(int rfd, const char *root, const char *name) {
    struct stat sb;
    if (fstatat(rfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? DT_OK : dt_error_set(DT_ERR_IO, "%s/%s: cannot stat: %s", root, name, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) {
        if (unlinkat(rfd, name, 0) != 0 && errno != ENOENT)
            return dt_error_set(DT_ERR_IO, "%s/%s: cannot remove: %s", root, name, strerror(errno));
        return DT_OK;
    }
    int fd = openat(rfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0) close(fd);
        return dt_error_set(DT_ERR_IO, "%s/%s: cannot open: %s", root, name, strerror(e));
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        unlinkat(fd, e->d_name, 0);
    }
    closedir(d);
    if (unlinkat(rfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT)
        return dt_error_set(DT_ERR_IO, "%s/%s: cannot remove: %s", root, name, strerror(errno));
    return DT_OK;
}

/* remove_at() on the entry `name` of the directory `root` */
static dt_status remove_dir(const char *root, const char *name) {
    int rfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (rfd < 0) return errno == ENOENT ? DT_OK : dt_error_set(DT_ERR_IO, "%s: cannot open: %s", root, strerror(errno));
    dt_status st = remove_at(rfd, root, name);
    close(rfd);
    return st;
}

static void root_dir(const char *run_dir, char *buf, size_t n) { snprintf(buf, n, "%s/checkpoints", run_dir); }

/* "step_00000012" -> 12; -1 when the name is not a checkpoint's */
static long step_of(const char *name) {
    if (strncmp(name, "step_", 5) != 0 || !name[5]) return -1;
    long v = 0;
    for (const char *p = name + 5; *p; p++) {
        if (*p < '0' || *p > '9' || v > 100000000000L) return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int cmp_long_desc(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Steps of the checkpoint directories under root, newest first; *count of them. The
 * caller frees the array. NULL with *count 0 when there are none (or no root). */
static long *list_steps(const char *root, int *count) {
    *count = 0;
    DIR *d = opendir(root);
    if (!d) return NULL;
    long *steps = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        long s = step_of(e->d_name);
        if (s < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            long *t = realloc(steps, (size_t)cap * sizeof *t);
            if (!t) break;
            steps = t;
        }
        steps[n++] = s;
    }
    closedir(d);
    if (n) qsort(steps, (size_t)n, sizeof *steps, cmp_long_desc);
    *count = n;
    return steps;
}

static void step_dir(const char *root, long step, char *buf, size_t n) { snprintf(buf, n, "%s/step_%08ld", root, step); }

/* ------------------------------------------------------------------ save */

/* trainer.json's "model": the architecture (model.type) and every shape field of arch.h */
static json_t *model_json(const dt_model_shape *m) {
    json_t *o = json_pack("{s:s}", "type", dt_arch_name(m->arch));
    int nf;
    const dt_shape_field *f = dt_shape_fields(&nf);
    for (int k = 0; o && k < nf; k++) {
        if (!((f[k].archs >> m->arch) & 1u)) continue; /* another architecture's */
        const double v = dt_shape_get(m, &f[k]);
        json_object_set_new(o, f[k].name, f[k].kind == DT_SHAPE_BOOL     ? json_boolean(v != 0)
                                          : f[k].kind == DT_SHAPE_DOUBLE ? json_real(v)
                                                                         : json_integer((json_int_t)v));
    }
    return o;
}

static json_t *best_json(const dt_ckpt_best *b) {
    return json_pack("{s:b, s:f, s:I, s:i, s:b}", "has", b->has, "value", isfinite(b->value) ? b->value : 0.0, "step",
                     (json_int_t)b->step, "evals_since", b->evals_since, "stopped_early", b->stopped_early);
}

/* trainer.json: where training stands, and the tokenizer the model trained with (cfg's
 * data.tokenizer_sha256; none for the byte tokenizer, whose checkpoints stay as they were) */
static json_t *trainer_json(const dt_ckpt_state *s, const dt_config *cfg) {
    char digest[16], seed[32], when[64];
    snprintf(digest, sizeof digest, "%08" PRIx32, s->config_digest);
    snprintf(seed, sizeof seed, "%" PRIu64, s->seed); /* a string: JSON numbers lose bits above 2^53 */
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    json_t *root = json_pack("{s:s, s:i, s:I, s:I, s:I, s:s, s:s, s:i, s:I, s:I, s:o, s:s, s:s}", "format", "dtrain-trainer-state",
                     "version", CKPT_VERSION, "step", (json_int_t)s->step, "epoch", (json_int_t)s->epoch, "cursor",
                     (json_int_t)s->cursor, "seed", seed, "config_digest", digest, "world_size", s->world,
                     "global_batch", (json_int_t)s->global_batch, "train_samples", (json_int_t)s->train_samples,
                     "model", model_json(&s->model), "rng",
                     "the only randomness after init is the sample order, a permutation seeded by (seed, epoch)",
                     "saved_at", when);
    if (root && (s->best.has || s->best.stopped_early)) json_object_set_new(root, "best", best_json(&s->best));
    if (root && s->lora.rank) {
        char names[256], base[16];
        snprintf(base, sizeof base, "%08" PRIx32, s->lora_base_digest);
        json_object_set_new(root, "lora", json_pack("{s:i, s:f, s:s, s:s, s:s, s:s}", "rank", s->lora.rank, "alpha",
                                                    s->lora.alpha, "targets",
                                                    dt_lora_targets_str(s->lora.targets, names, sizeof names),
                                                    "base", s->lora_base, "base_digest", base, "base_dtype",
                                                    s->lora.base_bf16 ? "bf16" : "fp32"));
    }
    if (root && cfg->data.tokenizer_sha256[0])
        json_object_set_new(root, "tokenizer_sha256", json_string(cfg->data.tokenizer_sha256));
    return root;
}

/* dt_st_write_parts's fill of the moments: entry i is tensor i % nt's exp_avg (i < nt) or
 * exp_avg_sq, read from the optimizer (it holds every moment) or, with s->gather, from the whole
 * moment gathered when the file first needs it */
typedef struct moments_src {
    dt_model *m;
    dt_optim *o;
    const dt_ckpt_state *s;
    const float *whole;
    int nt, gathered; /* moments gathered so far */
} moments_src;

static dt_status fill_moment_part(void *user, int i, size_t first, size_t n, float *buf) {
    moments_src *src = user;
    const dt_backend *be = dt_model_backend(src->m);
    const size_t at = dt_model_tensor(src->m, i % src->nt)->whole_offset + first;
    while (src->s->gather && src->gathered <= (i >= src->nt))
        DT_TRY(src->s->gather(src->s->user, 1 + src->gathered++, &src->whole));
    if (!src->s->gather) dt_optim_get_range(src->o, i >= src->nt, at, n, buf);
    else if (src->s->whole_on_backend) be->ops->download(be->ctx, buf, src->whole + at, n * sizeof(float));
    else memcpy(buf, src->whole + at, n * sizeof(float));
    return be->ops->check(be->ctx);
}

static dt_status save_optimizer(const char *path, dt_model *m, dt_optim *o, const dt_ckpt_state *s) {
    const int nt = dt_model_num_tensors(m);
    /* without s->gather the optimizer holds every moment of a model in one piece */
    const size_t n = dt_model_whole_params(m);
    if (!s->gather && (dt_optim_num_params(o) != n || dt_optim_moment_floats(o) != n))
        return dt_error_set(DT_ERR_INTERNAL, "%s: the optimizer holds %zu of the %zu moments and nothing gathers the "
                            "rest", path, dt_optim_moment_floats(o), n);
    dt_st_entry *e = dt_calloc(2 * (size_t)nt, sizeof *e, "optimizer tensor list");
    char(*names)[64] = dt_calloc(2 * (size_t)nt, sizeof *names, "optimizer tensor names");
    dt_status st = e && names ? DT_OK : DT_ERR_NOMEM;
    if (st == DT_OK) {
        for (int i = 0; i < 2 * nt; i++) {
            const dt_tensor_info *t = dt_model_tensor(m, i % nt);
            snprintf(names[i], sizeof names[i], "%s.%s", i < nt ? "exp_avg" : "exp_avg_sq", t->name);
            e[i].name = names[i];
            e[i].ndim = t->ndim;
            e[i].shape[0] = t->whole[0];
            e[i].shape[1] = t->whole[1];
        }
        const char *keys[] = {"format", "producer", "content"};
        const char *vals[] = {"pt", "dtrain", "AdamW moments (exp_avg, exp_avg_sq) per weight tensor"};
        moments_src src = {m, o, s, NULL, nt, 0};
        st = dt_st_write_parts(path, e, 2 * nt, keys, vals, 3, fill_moment_part, &src);
    }
    free(e);
    free(names);
    return st;
}

static dt_status write_config(const char *path, const dt_config *cfg) {
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) return dt_error_set(DT_ERR_NOMEM, "%s: out of memory", path);
    fprintf(mem, "# resolved configuration at this checkpoint\n");
    dt_config_print(cfg, mem);
    fclose(mem);
    dt_status st = write_file_synced(path, text);
    free(text);
    return st;
}

static dt_status write_manifest(const char *tmp, const dt_ckpt_state *s) {
    json_t *files = json_object();
    char p[PATH_LEN + 64];
    for (int i = 0; i < N_FILES; i++) {
        snprintf(p, sizeof p, "%s/%s", tmp, ckpt_files[i]);
        uint32_t crc;
        uint64_t bytes;
        dt_status st = crc_file(p, &crc, &bytes);
        if (st != DT_OK) {
            json_decref(files);
            return st;
        }
        char hex[16];
        snprintf(hex, sizeof hex, "%08" PRIx32, crc);
        json_object_set_new(files, ckpt_files[i], json_pack("{s:I, s:s}", "bytes", (json_int_t)bytes, "crc32", hex));
    }
    snprintf(p, sizeof p, "%s/manifest.json", tmp);
    return dt_json_write_new(p, json_pack("{s:s, s:i, s:I, s:o}", "format", CKPT_FORMAT, "version", CKPT_VERSION, "step",
                                          (json_int_t)s->step, "files", files), 0);
}

/* Writes the checkpoint as root/name (root exists). */
static dt_status save_as(const char *root, const char *name, dt_model *m, dt_optim *o, const dt_ckpt_state *s,
                         const dt_config *cfg, char *dir_out, size_t n) {
    char tmp[PATH_LEN + 64], final[PATH_LEN + 64], p[PATH_LEN + 128], tmp_name[64];
    snprintf(tmp_name, sizeof tmp_name, ".tmp-%s.%ld", name, (long)getpid());
    snprintf(tmp, sizeof tmp, "%s/%s", root, tmp_name);
    snprintf(final, sizeof final, "%s/%s", root, name);
    remove_dir(root, tmp_name); /* a leftover of this pid (after a failed save); a link there is unlinked, not followed */
    if (mkdir(tmp, 0755) != 0) return dt_error_set(DT_ERR_IO, "%s: cannot create directory: %s", tmp, strerror(errno));

    dt_status st;
    snprintf(p, sizeof p, "%s/model.safetensors", tmp);
    const float *whole = NULL; /* gathered weights (model parallelism), else the model's own */
    if (s->gather && (st = s->gather(s->user, 0, &whole)) != DT_OK) goto fail;
    if ((st = whole ? dt_model_save_whole(m, whole, p) : dt_model_save(m, p)) != DT_OK) goto fail;
    snprintf(p, sizeof p, "%s/optimizer.safetensors", tmp);
    if ((st = save_optimizer(p, m, o, s)) != DT_OK) goto fail;
    snprintf(p, sizeof p, "%s/trainer.json", tmp);
    if ((st = dt_json_write_new(p, trainer_json(s, cfg), 0)) != DT_OK) goto fail;
    snprintf(p, sizeof p, "%s/config.yaml", tmp);
    if ((st = write_config(p, cfg)) != DT_OK) goto fail;
    if ((st = write_manifest(tmp, s)) != DT_OK) goto fail;
    if ((st = fsync_path(tmp, 1)) != DT_OK) goto fail;

    /* an older checkpoint of the same step (a run restarted before it) is replaced only once
     * the new one is complete: swapped in one atomic step where the file system can, else
     * moved aside first (a crash in between leaves it as .old-step_N, which prune keeps
     * while step_N is missing). Whatever was at step_N — a link included — is renamed as
     * the entry it is and removed without following it. */
    struct stat sb;
    char old_name[64] = "";
    if (lstat(final, &sb) == 0) {
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
            snprintf(old_name, sizeof old_name, "%s", tmp_name); /* now holds the previous checkpoint */
        } else {
            char old[PATH_LEN + 96];
            snprintf(old_name, sizeof old_name, ".old-%s.%ld", name, (long)getpid());
            snprintf(old, sizeof old, "%s/%s", root, old_name);
            remove_dir(root, old_name);
            if (rename(final, old) != 0) {
                st = dt_error_set(DT_ERR_IO, "%s: cannot move the previous checkpoint aside: %s", final, strerror(errno));
                goto fail;
            }
            if (rename(tmp, final) != 0) {
                st = dt_error_set(DT_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
                rename(old, final); /* put the previous one back */
                goto fail;
            }
        }
    } else if (rename(tmp, final) != 0) {
        st = dt_error_set(DT_ERR_IO, "cannot rename %s to %s: %s", tmp, final, strerror(errno));
        goto fail;
    }
    if ((st = fsync_path(root, 1)) != DT_OK) return st;
    if (old_name[0]) remove_dir(root, old_name);
    if (dir_out && n) snprintf(dir_out, n, "%s", final);
    return DT_OK;
fail:
    remove_dir(root, tmp_name);
    dt_error_prefix("checkpoint of step %ld", s->step);
    return st;
}

dt_status dt_ckpt_save(const char *run_dir, dt_model *m, dt_optim *o, const dt_ckpt_state *s, const dt_config *cfg,
                       char *dir_out, size_t n) {
    char root[PATH_LEN], name[64];
    root_dir(run_dir, root, sizeof root);
    if (mkdir(root, 0755) == 0) DT_TRY(fsync_path(run_dir, 1)); /* checkpoints/ itself must survive a crash */
    else if (errno != EEXIST) return dt_error_set(DT_ERR_IO, "%s: cannot create directory: %s", root, strerror(errno));
    snprintf(name, sizeof name, "step_%08ld", s->step);
    return save_as(root, name, m, o, s, cfg, dir_out, n);
}

dt_status dt_ckpt_save_best(const char *run_dir, dt_model *m, dt_optim *o, const dt_ckpt_state *s,
                            const dt_config *cfg, char *dir_out, size_t n) {
    return save_as(run_dir, "best", m, o, s, cfg, dir_out, n);
}

/* Leftovers in `root` of writers that died mid-save, of the entries named PREFIX...: .tmp-NAME.PID
 * never became a checkpoint; .old-NAME.PID is a replaced one, kept only while NAME is missing (a
 * crash between the renames). Links among them are removed as links (remove_at). */
static void prune_leftovers(const char *root, const char *prefix) {
    DIR *d = opendir(root);
    if (!d) return;
    const size_t n = strlen(prefix);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const int tmp = strncmp(e->d_name, ".tmp-", 5) == 0, old = strncmp(e->d_name, ".old-", 5) == 0;
        if ((!tmp && !old) || strncmp(e->d_name + 5, prefix, n) != 0) continue;
        if (old) {
            char sd[PATH_LEN + 300];
            snprintf(sd, sizeof sd, "%s/%s", root, e->d_name + 5); /* "step_NNNNNNNN.PID", "best.PID" */
            char *dot = strrchr(sd, '.');
            if (dot) *dot = '\0';
            if (access(sd, F_OK) != 0) continue;
        }
        remove_at(dirfd(d), root, e->d_name);
    }
    closedir(d);
}

dt_status dt_ckpt_prune(const char *run_dir, int keep_last) {
    char root[PATH_LEN], name[64];
    root_dir(run_dir, root, sizeof root);
    int n;
    long *steps = list_steps(root, &n);
    dt_status st = DT_OK;
    for (int i = keep_last < 1 ? 1 : keep_last; i < n; i++) {
        snprintf(name, sizeof name, "step_%08ld", steps[i]);
        dt_status r = remove_dir(root, name);
        if (st == DT_OK) st = r;
    }
    free(steps);
    prune_leftovers(root, "step_");
    prune_leftovers(run_dir, "best."); /* best/ is written in the run directory (dt_ckpt_save_best) */
    return st;
}

/* ------------------------------------------------------------------ verify and load */

/* One integer field of trainer.json: present, an integer, and within [lo, hi]. */
typedef struct {
    json_t *obj;
    const char *key;
    long lo, hi;
    long *out;
} int_field;

static dt_status get_field(const char *path, const int_field *f) {
    json_t *v = json_object_get(f->obj, f->key);
    if (!v) return dt_error_set(DT_ERR_DATA, "%s: %s: missing", path, f->key);
    if (!json_is_integer(v)) return dt_error_set(DT_ERR_DATA, "%s: %s: expected an integer", path, f->key);
    json_int_t x = json_integer_value(v);
    if (x < f->lo || x > f->hi)
        return dt_error_set(DT_ERR_DATA, "%s: %s: expected an integer in [%ld, %ld], got %lld", path, f->key, f->lo,
                            f->hi, (long long)x);
    *f->out = (long)x;
    return DT_OK;
}

/* A string field that must be `maxlen` or fewer characters of `digits` (decimal or hex). */
static dt_status get_digits(const char *path, json_t *obj, const char *key, const char *digits, size_t maxlen,
                            const char **out) {
    const char *v = json_string_value(json_object_get(obj, key));
    if (!v) return dt_error_set(DT_ERR_DATA, "%s: %s: expected a string", path, key);
    size_t n = strlen(v);
    if (n == 0 || n > maxlen || strspn(v, digits) != n)
        return dt_error_set(DT_ERR_DATA, "%s: %s: expected at most %zu characters of %s, got \"%.40s\"", path, key,
                            maxlen, digits, v);
    *out = v;
    return DT_OK;
}

#define STEP_MAX 100000000000L      /* as many as a step_N name holds (step_of) */
#define SAMPLES_MAX (1L << 48)

/* trainer.json's optional "best" (absent: nothing counted yet). */
static dt_status best_fields(const char *path, json_t *b, dt_ckpt_best *out) {
    memset(out, 0, sizeof *out);
    if (!b) return DT_OK;
    long step, since;
    json_t *has = json_object_get(b, "has"), *early = json_object_get(b, "stopped_early"), *v = json_object_get(b, "value");
    const int_field f[] = {{b, "step", 0, STEP_MAX, &step}, {b, "evals_since", 0, INT_MAX, &since}};
    if (!json_is_object(b) || !json_is_boolean(has) || !json_is_boolean(early) || !json_is_number(v))
        return dt_error_set(DT_ERR_DATA, "%s: best: expected an object with has, value, step, evals_since and "
                            "stopped_early", path);
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) DT_TRY(get_field(path, &f[i]));
    out->has = json_is_true(has);
    out->value = json_number_value(v);
    out->step = step;
    out->evals_since = (int)since;
    out->stopped_early = json_is_true(early);
    return DT_OK;
}

/* trainer.json's optional "lora" (absent: none) */
static dt_status lora_fields(const char *path, json_t *o, dt_ckpt_state *s) {
    if (!o) return DT_OK;
    json_t *rank = json_object_get(o, "rank"), *alpha = json_object_get(o, "alpha"), *tg = json_object_get(o, "targets"),
           *base = json_object_get(o, "base"), *dg = json_object_get(o, "base_digest"),
           *bd = json_object_get(o, "base_dtype");
    const char *names = json_string_value(tg), *b = json_string_value(base), *d = json_string_value(dg);
    const char *dt = bd ? json_string_value(bd) : "fp32"; /* absent: written before model.lora.base_dtype */
    if (!json_is_object(o) || !json_is_integer(rank) || json_integer_value(rank) < 1 ||
        json_integer_value(rank) > 4096 || !json_is_number(alpha) || !(json_number_value(alpha) > 0) || !names || !b ||
        strlen(b) >= sizeof s->lora_base || !d || strlen(d) != 8 || strspn(d, "0123456789abcdef") != 8 || !dt ||
        (strcmp(dt, "fp32") && strcmp(dt, "bf16")))
        return dt_error_set(DT_ERR_DATA, "%s: lora: expected {rank: 1..4096, alpha: > 0, targets: names, base: a "
                            "path, base_digest: 8 hex digits, base_dtype: fp32 or bf16}", path);
    s->lora.base_bf16 = strcmp(dt, "bf16") == 0;
    s->lora.rank = (int)json_integer_value(rank);
    s->lora.alpha = json_number_value(alpha);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", names);
    for (char *save = NULL, *t = strtok_r(buf, ", ", &save); t; t = strtok_r(NULL, ", ", &save)) {
        const int i = dt_lora_target_parse(t);
        if (i < 0) return dt_error_set(DT_ERR_DATA, "%s: lora.targets: %s is no projection dtrain knows", path, t);
        s->lora.targets |= 1u << i;
    }
    snprintf(s->lora_base, sizeof s->lora_base, "%s", b);
    s->lora_base_digest = (uint32_t)strtoul(d, NULL, 16);
    return DT_OK;
}

/* trainer.json's "model": a "type" (absent in checkpoints written before there was more than
 * GPT-2: gpt2) and every shape field of arch.h that architecture has, range-checked; an
 * architecture's own fields absent (a checkpoint from before they existed) and the others keep
 * their defaults. */
static dt_status model_fields(const char *path, json_t *model, dt_model_shape *out) {
    memset(out, 0, sizeof *out);
    json_t *type = json_object_get(model, "type");
    if (type && (!json_is_string(type) || dt_arch_parse(json_string_value(type), &out->arch) != DT_OK))
        return dt_error_set(DT_ERR_DATA, "%s: model.type: expected the name of an architecture dtrain builds", path);
    int nf;
    const dt_shape_field *f = dt_shape_fields(&nf);
    for (int k = 0; k < nf; k++) {
        json_t *j = (f[k].archs >> out->arch) & 1u ? json_object_get(model, f[k].name) : NULL;
        double v = dt_shape_default(&f[k]);
        if (!((f[k].archs >> out->arch) & 1u)) {
            dt_shape_set(out, &f[k], v);
            continue;
        }
        if (f[k].kind == DT_SHAPE_INT && (j || f[k].archs == DT_ARCHS_ALL)) {
            long i;
            const int_field fi = {model, f[k].name, (long)f[k].min, INT_MAX, &i};
            DT_TRY(get_field(path, &fi));
            v = (double)i;
        } else if (j && f[k].kind == DT_SHAPE_BOOL) {
            if (!json_is_boolean(j)) return dt_error_set(DT_ERR_DATA, "%s: %s: expected true or false", path, f[k].name);
            v = json_is_true(j);
        } else if (j) {
            const double x = json_is_number(j) ? json_number_value(j) : NAN;
            if (!isfinite(x) || (f[k].min_open ? !(x > f[k].min) : !(x >= f[k].min)))
                return dt_error_set(DT_ERR_DATA, "%s: %s: expected a number %s %g", path, f[k].name,
                                    f[k].min_open ? ">" : ">=", f[k].min);
            v = json_number_value(j);
        }
        dt_shape_set(out, &f[k], v);
    }
    return DT_OK;
}

/* Every field of trainer.json, range-checked (a crafted or damaged file must not overflow
 * the arithmetic of the resume, nor pass the shape check by truncation). */
static dt_status trainer_fields(const char *path, json_t *root, dt_ckpt_state *s) {
    long version, step, epoch, cursor, world, gb, samples;
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return dt_error_set(DT_ERR_DATA, "%s: model: expected an object", path);
    const int_field f[] = {
        {root, "version", 0, LONG_MAX, &version},      {root, "step", 0, STEP_MAX, &step},
        {root, "epoch", 0, INT_MAX - 1, &epoch},       {root, "train_samples", 0, SAMPLES_MAX, &samples},
        {root, "cursor", 0, SAMPLES_MAX, &cursor},     {root, "world_size", 1, DT_MAX_WORLD, &world},
        {root, "global_batch", 1, INT_MAX, &gb},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) {
        DT_TRY(get_field(path, &f[i]));
        if (i == 0 && version != CKPT_VERSION)
            return dt_error_set(DT_ERR_DATA, "%s: trainer state version %ld, this dtrain reads version %d", path,
                                version, CKPT_VERSION);
    }
    if (cursor > samples)
        return dt_error_set(DT_ERR_DATA, "%s: cursor: expected at most train_samples (%ld), got %ld", path, samples,
                            cursor);
    const char *seed, *digest;
    DT_TRY(get_digits(path, root, "seed", "0123456789", 20, &seed));
    DT_TRY(get_digits(path, root, "config_digest", "0123456789abcdefABCDEF", 8, &digest));
    errno = 0;
    unsigned long long sv = strtoull(seed, NULL, 10);
    if (errno == ERANGE) return dt_error_set(DT_ERR_DATA, "%s: seed: expected at most %llu, got %s", path, ULLONG_MAX, seed);
    s->step = step;
    s->epoch = epoch;
    s->cursor = (size_t)cursor;
    s->world = (int)world;
    s->global_batch = gb;
    s->train_samples = (size_t)samples;
    s->seed = (uint64_t)sv;
    s->config_digest = (uint32_t)strtoul(digest, NULL, 16);
    json_t *sha = json_object_get(root, "tokenizer_sha256"); /* absent: the byte tokenizer, or an older checkpoint */
    const char *hex = json_string_value(sha);
    if (sha && !(hex && strlen(hex) == 64 && strspn(hex, "0123456789abcdef") == 64))
        return dt_error_set(DT_ERR_DATA, "%s: tokenizer_sha256: expected 64 characters of 0123456789abcdef (a SHA-256)",
                            path);
    if (sha) memcpy(s->tokenizer_sha256, hex, 65);
    DT_TRY(model_fields(path, model, &s->model));
    DT_TRY(lora_fields(path, json_object_get(root, "lora"), s));
    return best_fields(path, json_object_get(root, "best"), &s->best);
}

static dt_status parse_trainer(const char *path, dt_ckpt_state *s) {
    json_t *root;
    DT_TRY(dt_json_read(path, 0, &root));
    memset(s, 0, sizeof *s);
    dt_status st = json_is_object(root) ? trainer_fields(path, root, s)
                                        : dt_error_set(DT_ERR_DATA, "%s: expected a JSON object", path);
    json_decref(root);
    return st;
}

dt_status dt_ckpt_verify(const char *dir, dt_ckpt_state *s) {
    char p[PATH_LEN + 300];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    json_t *man;
    if (dt_json_read(p, 0, &man) != DT_OK) { /* a FIFO there must not block the search */
        if (access(p, F_OK) != 0)
            return dt_error_set(DT_ERR_DATA, "%s: missing: the checkpoint is incomplete", p);
        return DT_ERR_DATA;
    }
    dt_status st = DT_OK;
    const char *fmt = json_string_value(json_object_get(man, "format"));
    json_t *files = json_object_get(man, "files");
    if (!fmt || strcmp(fmt, CKPT_FORMAT) != 0 || !json_is_object(files))
        st = dt_error_set(DT_ERR_DATA, "%s: not a dtrain checkpoint manifest (expected \"format\": \"%s\" and \"files\")",
                          p, CKPT_FORMAT);
    for (int i = 0; st == DT_OK && i < N_FILES; i++) {
        json_t *f = json_object_get(files, ckpt_files[i]);
        json_t *jb = json_object_get(f, "bytes");
        const char *hex = json_string_value(json_object_get(f, "crc32"));
        if (!json_is_integer(jb) || !hex) {
            st = dt_error_set(DT_ERR_DATA, "%s: no size and crc32 for %s", p, ckpt_files[i]);
            break;
        }
        char fp[PATH_LEN + 300];
        snprintf(fp, sizeof fp, "%s/%s", dir, ckpt_files[i]);
        uint32_t crc;
        uint64_t bytes;
        if ((st = crc_file(fp, &crc, &bytes)) != DT_OK) break;
        uint64_t want_bytes = (uint64_t)json_integer_value(jb);
        uint32_t want_crc = (uint32_t)strtoul(hex, NULL, 16);
        if (bytes != want_bytes)
            st = dt_error_set(DT_ERR_DATA, "%s: %" PRIu64 " bytes, the manifest says %" PRIu64 " (truncated or partly written)",
                              fp, bytes, want_bytes);
        else if (crc != want_crc)
            st = dt_error_set(DT_ERR_DATA, "%s: crc32 %08" PRIx32 ", the manifest says %08" PRIx32 " (the file is corrupt)",
                              fp, crc, want_crc);
    }
    json_decref(man);
    if (st != DT_OK) return st;
    snprintf(p, sizeof p, "%s/trainer.json", dir);
    return parse_trainer(p, s);
}

dt_status dt_ckpt_find_latest(const char *dir, dt_ckpt_report_fn report, void *user, char *dir_out, size_t n,
                              dt_ckpt_state *s, int *found) {
    *found = 0;
    char p[PATH_LEN + 300];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    if (access(p, F_OK) == 0) { /* a checkpoint itself: it must verify */
        DT_TRY(dt_ckpt_verify(dir, s));
        snprintf(dir_out, n, "%s", dir);
        *found = 1;
        return DT_OK;
    }
    char root[PATH_LEN];
    root_dir(dir, root, sizeof root);
    int count;
    long *steps = list_steps(root, &count);
    for (int i = 0; i < count && !*found; i++) {
        step_dir(root, steps[i], p, sizeof p);
        dt_status st = dt_ckpt_verify(p, s);
        if (st == DT_OK) {
            snprintf(dir_out, n, "%s", p);
            *found = 1;
        } else if (st != DT_ERR_DATA) { /* the disk failed us, not the checkpoint: do not pass it over */
            free(steps);
            return st;
        } else if (report) {
            char msg[2048];
            snprintf(msg, sizeof msg, "%s", dt_error_msg());
            report(user, msg);
        }
    }
    free(steps);
    return DT_OK;
}

dt_status dt_ckpt_check_shape(const dt_ckpt_state *s, const dt_model_shape *now, const char *dir) {
    int nf;
    const dt_shape_field *f = dt_shape_fields(&nf);
    char key[64], saved[32], mine[32];
    for (int k = -1; k < nf; k++) {
        if (k < 0) { /* the architecture first */
            snprintf(key, sizeof key, "model.type");
            snprintf(saved, sizeof saved, "%s", dt_arch_name(s->model.arch));
            snprintf(mine, sizeof mine, "%s", dt_arch_name(now->arch));
        } else {
            if (!((f[k].archs >> now->arch) & 1u)) continue; /* another architecture's */
            snprintf(key, sizeof key, "model.%s", f[k].name);
            dt_shape_str(&s->model, &f[k], saved, sizeof saved);
            dt_shape_str(now, &f[k], mine, sizeof mine);
        }
        if (strcmp(saved, mine) != 0)
            return dt_error_set(DT_ERR_CONFIG,
                                "%s: checkpoint trained with %s: %s, the config says %s: refusing to resume a "
                                "different model (hint: restore the model settings, or start fresh with "
                                "checkpoint.resume: never or another run.dir)",
                                dir, key, saved, mine);
    }
    return DT_OK;
}

static void lora_str(const dt_lora *l, char *buf, size_t n) {
    char names[256];
    if (!l->rank) snprintf(buf, n, "no model.lora");
    else snprintf(buf, n, "model.lora rank %d, alpha %g on %s", l->rank, l->alpha,
                  dt_lora_targets_str(l->targets, names, sizeof names));
}

dt_status dt_ckpt_check_lora(const dt_ckpt_state *s, const dt_lora *now, const char *dir) {
    if (s->lora.rank == now->rank && (!now->rank || (s->lora.alpha == now->alpha && s->lora.targets == now->targets)))
        return DT_OK;
    char saved[320], mine[320];
    lora_str(&s->lora, saved, sizeof saved);
    lora_str(now, mine, sizeof mine);
    return dt_error_set(DT_ERR_CONFIG, "%s: checkpoint trained with %s, the config says %s: refusing to resume a "
                        "different model (hint: restore model.lora, or start fresh with checkpoint.resume: never or "
                        "another run.dir)", dir, saved, mine);
}

dt_status dt_ckpt_check_tokenizer(const dt_ckpt_state *s, const dt_config *cfg, const char *dir) {
    const char *now = cfg->data.tokenizer_sha256;
    if (!s->tokenizer_sha256[0] || strcmp(s->tokenizer_sha256, now) == 0) return DT_OK;
    char what[DT_PATH_MAX + 96];
    if (now[0]) snprintf(what, sizeof what, "data.tokenizer %s has SHA-256 %s", cfg->data.tokenizer, now);
    else snprintf(what, sizeof what, "data.tokenizer is bytes");
    return dt_error_set(DT_ERR_CONFIG,
                        "%s: checkpoint trained with data.tokenizer of SHA-256 %s, but %s: refusing to resume with "
                        "another tokenizer (its ids mean other text; hint: restore the tokenizer file, or start fresh "
                        "with checkpoint.resume: never or another run.dir)",
                        dir, s->tokenizer_sha256, what);
}

static dt_status load_optimizer(const char *path, dt_model *m, dt_optim *o) {
    dt_st_file *f = NULL;
    DT_TRY(dt_st_open(&f, path));
    const size_t n = dt_model_whole_params(m);
    /* each tensor read a part at a time into the optimizer's ranges (a ZeRO-1 shard keeps its own);
     * with model parallelism a tensor at a time, this share's part kept (another stage's skipped) */
    const int shares = dt_model_config(m)->tp > 1 || dt_model_config(m)->pp > 1;
    const int nt = dt_model_num_tensors(m);
    size_t most = DT_ST_PART, share_most = 1; /* a model-parallel tensor whole, and its share */
    for (int i = 0; shares && i < nt; i++) {
        const dt_tensor_info *t = dt_model_tensor(m, i);
        if (t->absent) continue; /* another stage's: never read here */
        if ((size_t)t->whole[0] * (size_t)t->whole[1] > most) most = (size_t)t->whole[0] * (size_t)t->whole[1];
        if (t->split != DT_SPLIT_NONE && t->numel > share_most) share_most = t->numel;
    }
    float *part = dt_malloc(most * sizeof(float), "optimizer staging");
    float *share = shares ? dt_malloc(share_most * sizeof(float), "optimizer share") : NULL;
    dt_status st = part && (share || !shares) ? DT_OK : DT_ERR_NOMEM;
    if (st == DT_OK && !shares && dt_optim_num_params(o) != n)
        st = dt_error_set(DT_ERR_INTERNAL, "optimizer: %zu parameters for a model of %zu", dt_optim_num_params(o), n);
    for (int i = 0; st == DT_OK && i < 2 * nt; i++) {
        const dt_tensor_info *t = dt_model_tensor(m, i % nt);
        const size_t numel = (size_t)t->whole[0] * (size_t)t->whole[1];
        char name[64];
        snprintf(name, sizeof name, "%s.%s", i < nt ? "exp_avg" : "exp_avg_sq", t->name);
        const dt_st_tensor *ft = dt_st_find(f, name);
        if (!ft) st = dt_error_set(DT_ERR_DATA, "%s: tensor %s is missing", path, name);
        else if (ft->numel != numel)
            st = dt_error_set(DT_ERR_DATA, "%s: tensor %s has %zu elements, the model needs %zu", path, name, ft->numel,
                              numel);
        else if (shares) {
            if (t->absent) continue; /* another stage's */
            if ((st = dt_st_read_f32(f, ft, part)) == DT_OK) st = dt_check_finite(part, numel, path, name);
            if (st != DT_OK) break;
            if (t->split != DT_SPLIT_NONE) dt_model_tensor_share(m, i % nt, part, share); /* else the share is whole */
            dt_optim_set_range(o, i >= nt, t->offset, t->numel, t->split != DT_SPLIT_NONE ? share : part);
        } else { /* parts put in place as they come, as dt_model_load's: a NaN or Inf fails the load */
            dt_finite_tally bad = {0, 0, 0.0f};
            for (size_t first = 0; st == DT_OK && first < numel; first += DT_ST_PART) {
                const size_t k = numel - first < DT_ST_PART ? numel - first : DT_ST_PART;
                if ((st = dt_st_read_f32_part(f, ft, first, k, part)) != DT_OK) break;
                if (dt_finite_add(&bad, part, k, first) || bad.bad) continue; /* counted to the end, then refused */
                dt_optim_set_range(o, i >= nt, t->whole_offset + first, k, part);
            }
            if (st == DT_OK) st = dt_finite_verdict(&bad, path, name);
        }
    }
    free(part);
    free(share);
    dt_st_close(f);
    return st;
}

dt_status dt_ckpt_load(const char *dir, dt_model *m, dt_optim *o) {
    char p[PATH_LEN + 300];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    int score_loaded = 1;
    DT_TRY(dt_model_load(m, p, &score_loaded));
    if (!score_loaded)
        return dt_error_set(DT_ERR_DATA, "%s: tensor score.weight is missing: not a checkpoint of this classifier", p);
    snprintf(p, sizeof p, "%s/optimizer.safetensors", dir);
    return load_optimizer(p, m, o);
}

dt_status dt_ckpt_set_aside(const char *run_dir, long after_step, char *moved_to, size_t n) {
    if (n) moved_to[0] = '\0';
    char root[PATH_LEN];
    root_dir(run_dir, root, sizeof root);
    int count;
    long *steps = list_steps(root, &count);
    int moving = 0;
    for (int i = 0; i < count; i++) moving += steps[i] > after_step;
    if (moving == 0) {
        free(steps);
        return DT_OK;
    }
    char stamp[32], dst[PATH_LEN + 64];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(dst, sizeof dst, "%s.prev-%s", root, stamp);
    struct stat sb; /* lstat: a dangling link there is taken too */
    for (int k = 1; lstat(dst, &sb) == 0 && k < 100; k++) snprintf(dst, sizeof dst, "%s.prev-%s.%d", root, stamp, k);
    dt_status st = DT_OK;
    if (after_step < 0) { /* all of it */
        int r = renameat2(AT_FDCWD, root, AT_FDCWD, dst, RENAME_NOREPLACE); /* never onto a name made meanwhile */
        if (r != 0 && errno == EINVAL && lstat(dst, &sb) != 0) r = rename(root, dst); /* no NOREPLACE here */
        if (r != 0) st = dt_error_set(DT_ERR_IO, "cannot move %s aside to %s: %s", root, dst, strerror(errno));
    } else if (mkdir(dst, 0755) != 0) {
        st = dt_error_set(DT_ERR_IO, "%s: cannot create directory: %s", dst, strerror(errno));
    } else {
        for (int i = 0; i < count && st == DT_OK; i++) {
            if (steps[i] <= after_step) continue;
            char from[PATH_LEN + 64], to[PATH_LEN + 128];
            step_dir(root, steps[i], from, sizeof from);
            snprintf(to, sizeof to, "%s/step_%08ld", dst, steps[i]);
            if (rename(from, to) != 0)
                st = dt_error_set(DT_ERR_IO, "cannot move %s aside to %s: %s", from, to, strerror(errno));
        }
        if (st == DT_OK) st = fsync_path(root, 1);
    }
    free(steps);
    if (st == DT_OK && n) snprintf(moved_to, n, "%s", dst);
    return st;
}
