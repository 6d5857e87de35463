/* safetensors.c — read and write safetensors files (see include/dtrain/safetensors.h).
 *
 * Reading keeps the file open and the parsed jansson header alive: tensor names, dtype
 * names and metadata strings point into that header and are freed by dt_st_close.
 * Tensor data is read on demand with pread; the whole file is never loaded.
 * Writing builds the header with jansson (__metadata__ first, tensors in the order given),
 * pads it with spaces to a multiple of 8 and replaces the target atomically. */
#include "dtrain/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/file.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host (F32 data is written and read as is)"
#endif

#define ST_MAX_HEADER 100000000ull /* the reference implementation's limit */
#define ST_CHUNK 65536             /* bytes converted per pread for F16/BF16 */

struct dt_st_file {
    int fd;
    char *path;
    json_t *root;            /* parsed header; owns every string the tensors point to */
    json_t *meta;            /* borrowed from root, or NULL */
    uint64_t data_start;     /* 8 + header length */
    uint64_t data_size;      /* file size - data_start */
    int n;
    dt_st_tensor *tensors;   /* (n) in header order */
};

/* ---- dtypes ---- */

typedef struct { const char *name; dt_st_dtype dtype; size_t size; } st_dtype_info;

/* Every dtype of the safetensors spec; those we cannot convert are DT_ST_OTHER but still
 * have their sizes checked. */
static const st_dtype_info st_dtypes[] = {
    {"F32", DT_ST_F32, 4},   {"F16", DT_ST_F16, 2},      {"BF16", DT_ST_BF16, 2},
    {"F64", DT_ST_OTHER, 8}, {"I64", DT_ST_OTHER, 8},    {"U64", DT_ST_OTHER, 8},
    {"I32", DT_ST_OTHER, 4}, {"U32", DT_ST_OTHER, 4},    {"I16", DT_ST_OTHER, 2},
    {"U16", DT_ST_OTHER, 2}, {"I8", DT_ST_OTHER, 1},     {"U8", DT_ST_OTHER, 1},
    {"BOOL", DT_ST_OTHER, 1}, {"F8_E5M2", DT_ST_OTHER, 1}, {"F8_E4M3", DT_ST_OTHER, 1},
};

/* Returns the dtype and its element size in bytes (0 when unknown). */
static dt_st_dtype st_dtype_lookup(const char *name, size_t *size) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++) {
        if (strcmp(st_dtypes[i].name, name) == 0) {
            *size = st_dtypes[i].size;
            return st_dtypes[i].dtype;
        }
    }
    *size = 0;
    return DT_ST_OTHER;
}

static float st_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign; /* +-0 */
        } else {     /* subnormal: mant * 2^-24, renormalise */
            uint32_t e = 127 - 15 + 1;
            while (!(mant & 0x400u)) {
                mant <<= 1;
                e--;
            }
            bits = sign | (e << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13); /* inf, or nan keeping its payload */
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static float st_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* "[2, 3]", "[]" for a scalar. */
static void st_format_shape(char *buf, size_t cap, const int64_t *shape, int ndim) {
    size_t len = 0;
    buf[0] = '\0';
    len += (size_t)snprintf(buf + len, cap - len, "[");
    for (int d = 0; d < ndim && len < cap; d++)
        len += (size_t)snprintf(buf + len, cap - len, d ? ", %" PRId64 : "%" PRId64, shape[d]);
    if (len < cap) snprintf(buf + len, cap - len, "]");
}

/* ---- reading ---- */

/* pread exactly `len` bytes at `off`; returns the byte count read (< len at end of file),
 * or -1 with errno set. */
static ssize_t st_pread_full(int fd, void *buf, size_t len, uint64_t off) {
    size_t got = 0;
    while (got < len) {
        ssize_t r = pread(fd, (char *)buf + got, len - got, (off_t)(off + got));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

typedef struct { uint64_t begin, end; int idx; } st_span;

static int st_span_cmp(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx - y->idx;
}

/* Non-negative JSON integer into *v; 0 if `j` is not one. */
static int st_get_uint(const json_t *j, uint64_t *v) {
    if (!json_is_integer(j) || json_integer_value(j) < 0) return 0;
    *v = (uint64_t)json_integer_value(j);
    return 1;
}

/* Validates one header entry and fills `t`. */
static dt_status st_parse_entry(const char *path, const char *name, json_t *e,
                                uint64_t data_size, dt_st_tensor *t) {
    if (!json_is_object(e))
        return dt_error_set(DT_ERR_DATA,
                            "%s: tensor %s: expected an object with \"dtype\", \"shape\" and "
                            "\"data_offsets\"", path, name);
    t->name = name;

    json_t *jd = json_object_get(e, "dtype");
    if (!jd) return dt_error_set(DT_ERR_DATA, "%s: tensor %s: missing \"dtype\"", path, name);
    if (!json_is_string(jd))
        return dt_error_set(DT_ERR_DATA, "%s: tensor %s: \"dtype\" must be a string", path, name);
    t->dtype_name = json_string_value(jd);
    size_t esize;
    t->dtype = st_dtype_lookup(t->dtype_name, &esize);

    json_t *js = json_object_get(e, "shape");
    if (!js) return dt_error_set(DT_ERR_DATA, "%s: tensor %s: missing \"shape\"", path, name);
    if (!json_is_array(js))
        return dt_error_set(DT_ERR_DATA, "%s: tensor %s: \"shape\" must be an array of integers",
                            path, name);
    size_t nd = json_array_size(js);
    if (nd > DT_ST_MAX_DIMS)
        return dt_error_set(DT_ERR_DATA,
                            "%s: tensor %s: shape has %zu dimensions, at most %d are supported",
                            path, name, nd, DT_ST_MAX_DIMS);
    t->ndim = (int)nd;
    for (size_t d = 0; d < nd; d++) {
        json_t *jv = json_array_get(js, d);
        if (!json_is_integer(jv))
            return dt_error_set(DT_ERR_DATA,
                                "%s: tensor %s: \"shape\" must be an array of integers", path, name);
        t->shape[d] = (int64_t)json_integer_value(jv);
    }
    char shape_str[256];
    st_format_shape(shape_str, sizeof shape_str, t->shape, t->ndim);
    size_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
            return dt_error_set(DT_ERR_DATA, "%s: tensor %s: shape %s has a negative dimension",
                                path, name, shape_str);
    }
    for (int d = 0; d < t->ndim; d++) {
        if (__builtin_mul_overflow(numel, (size_t)t->shape[d], &numel))
            return dt_error_set(DT_ERR_DATA, "%s: tensor %s: shape %s is too large", path, name,
                                shape_str);
    }
    t->numel = numel;

    json_t *jo = json_object_get(e, "data_offsets");
    if (!jo)
        return dt_error_set(DT_ERR_DATA, "%s: tensor %s: missing \"data_offsets\"", path, name);
    uint64_t begin, end;
    if (!json_is_array(jo) || json_array_size(jo) != 2 ||
        !st_get_uint(json_array_get(jo, 0), &begin) || !st_get_uint(json_array_get(jo, 1), &end))
        return dt_error_set(DT_ERR_DATA,
                            "%s: tensor %s: \"data_offsets\" must be [begin, end] with two "
                            "non-negative integers", path, name);
    if (begin > end)
        return dt_error_set(DT_ERR_DATA,
                            "%s: tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] end before begin",
                            path, name, begin, end);
    if (esize) {
        size_t need;
        if (__builtin_mul_overflow(numel, esize, &need))
            return dt_error_set(DT_ERR_DATA, "%s: tensor %s: shape %s is too large", path, name,
                                shape_str);
        if ((uint64_t)need != end - begin)
            return dt_error_set(DT_ERR_DATA,
                                "%s: tensor %s: data_offsets span %" PRIu64 " bytes but shape %s "
                                "of %s needs %zu", path, name, end - begin, shape_str,
                                t->dtype_name, need);
    }
    if (end > data_size)
        return dt_error_set(DT_ERR_DATA,
                            "%s: tensor %s: data_offsets end %" PRIu64 " is beyond the data "
                            "section (%" PRIu64 " bytes)", path, name, end, data_size);
    t->offset = (size_t)begin;
    t->nbytes = (size_t)(end - begin);
    return DT_OK;
}

static dt_status st_check_overlap(const dt_st_file *f) {
    if (f->n < 2) return DT_OK;
    st_span *s = dt_malloc((size_t)f->n * sizeof *s, "safetensors spans");
    if (!s) return DT_ERR_NOMEM;
    int m = 0;
    for (int i = 0; i < f->n; i++) {
        if (f->tensors[i].nbytes == 0) continue; /* empty tensors occupy nothing */
        s[m].begin = f->tensors[i].offset;
        s[m].end = f->tensors[i].offset + f->tensors[i].nbytes;
        s[m].idx = i;
        m++;
    }
    qsort(s, (size_t)m, sizeof *s, st_span_cmp);
    dt_status st = DT_OK;
    for (int i = 1; i < m; i++) {
        if (s[i].begin < s[i - 1].end) {
            st = dt_error_set(DT_ERR_DATA,
                              "%s: tensors %s [%" PRIu64 ", %" PRIu64 ") and %s [%" PRIu64
                              ", %" PRIu64 ") overlap in the data section", f->path,
                              f->tensors[s[i - 1].idx].name, s[i - 1].begin, s[i - 1].end,
                              f->tensors[s[i].idx].name, s[i].begin, s[i].end);
            break;
        }
    }
    free(s);
    return st;
}

static dt_status st_parse_header(dt_st_file *f, const char *buf, size_t len) {
    json_error_t jerr;
    f->root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!f->root)
        return dt_error_set(DT_ERR_DATA, "%s: header JSON error at line %d column %d: %s",
                            f->path, jerr.line, jerr.column, jerr.text);
    if (!json_is_object(f->root))
        return dt_error_set(DT_ERR_DATA, "%s: header is not a JSON object", f->path);

    size_t count = json_object_size(f->root);
    json_t *meta = json_object_get(f->root, "__metadata__");
    if (meta) {
        count--;
        if (!json_is_object(meta))
            return dt_error_set(DT_ERR_DATA,
                                "%s: \"__metadata__\" must be an object of string values", f->path);
        const char *k;
        json_t *v;
        json_object_foreach(meta, k, v) {
            if (!json_is_string(v))
                return dt_error_set(DT_ERR_DATA,
                                    "%s: \"__metadata__\" key %s: value must be a string",
                                    f->path, k);
        }
        f->meta = meta;
    }
    if (count > (size_t)INT32_MAX)
        return dt_error_set(DT_ERR_DATA, "%s: too many tensors (%zu)", f->path, count);

    f->tensors = dt_calloc(count, sizeof *f->tensors, "safetensors tensor table");
    if (!f->tensors) return DT_ERR_NOMEM;
    const char *name;
    json_t *e;
    json_object_foreach(f->root, name, e) { /* jansson keeps insertion (file) order */
        if (strcmp(name, "__metadata__") == 0) continue;
        DT_TRY(st_parse_entry(f->path, name, e, f->data_size, &f->tensors[f->n]));
        f->n++;
    }
    return st_check_overlap(f);
}

dt_status dt_st_open(dt_st_file **out, const char *path) {
    *out = NULL;
    dt_status st = DT_OK;
    char *hbuf = NULL;
    dt_st_file *f = dt_calloc(1, sizeof *f, "safetensors file");
    if (!f) return DT_ERR_NOMEM;
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path) {
        st = dt_error_set(DT_ERR_NOMEM, "out of memory copying path %s", path);
        goto fail;
    }
    /* a FIFO or a device is refused before it can block (DT_ERR_DATA: bad input, exit 2) */
    if ((st = dt_file_open_regular(path, DT_ERR_DATA, &f->fd)) != DT_OK) goto fail;
    struct stat sb;
    if (fstat(f->fd, &sb) != 0) {
        st = dt_error_set(DT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    uint64_t fsize = (uint64_t)sb.st_size;
    if (fsize < 8) {
        st = dt_error_set(DT_ERR_DATA,
                          "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length "
                          "(not a safetensors file?)", path, fsize);
        goto fail;
    }
    unsigned char lenb[8];
    ssize_t r = st_pread_full(f->fd, lenb, 8, 0);
    if (r != 8) {
        st = dt_error_set(DT_ERR_IO, "%s: cannot read the header length: %s", path,
                          r < 0 ? strerror(errno) : "short read");
        goto fail;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | lenb[i];
    if (hlen > ST_MAX_HEADER) {
        st = dt_error_set(DT_ERR_DATA,
                          "%s: header length %" PRIu64 " exceeds the 100 MB limit (not a "
                          "safetensors file?)", path, hlen);
        goto fail;
    }
    if (hlen > fsize - 8) {
        st = dt_error_set(DT_ERR_DATA,
                          "%s: header length %" PRIu64 " is larger than the rest of the file "
                          "(%" PRIu64 " bytes; truncated?)", path, hlen, fsize - 8);
        goto fail;
    }
    f->data_start = 8 + hlen;
    f->data_size = fsize - f->data_start;
    hbuf = dt_malloc((size_t)hlen, "safetensors header");
    if (!hbuf) {
        st = DT_ERR_NOMEM;
        goto fail;
    }
    r = st_pread_full(f->fd, hbuf, (size_t)hlen, 8);
    if (r != (ssize_t)hlen) {
        st = dt_error_set(DT_ERR_IO, "%s: cannot read the header: %s", path,
                          r < 0 ? strerror(errno) : "short read");
        goto fail;
    }
    st = st_parse_header(f, hbuf, (size_t)hlen);
    if (st != DT_OK) goto fail;
    free(hbuf);
    *out = f;
    return DT_OK;
fail:
    free(hbuf);
    dt_st_close(f);
    return st;
}

void dt_st_close(dt_st_file *f) {
    if (!f) return;
    if (f->fd >= 0) close(f->fd);
    free(f->tensors);
    if (f->root) json_decref(f->root);
    free(f->path);
    free(f);
}

int dt_st_count(const dt_st_file *f) { return f ? f->n : 0; }

const dt_st_tensor *dt_st_tensor_at(const dt_st_file *f, int i) {
    if (!f || i < 0 || i >= f->n) return NULL;
    return &f->tensors[i];
}

const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name) {
    if (!f || !name) return NULL;
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

const char *dt_st_metadata(const dt_st_file *f, const char *key) {
    if (!f || !f->meta || !key) return NULL;
    return json_string_value(json_object_get(f->meta, key));
}

static dt_status st_read_error(const dt_st_file *f, const dt_st_tensor *t, ssize_t r,
                               size_t want) {
    if (r < 0)
        return dt_error_set(DT_ERR_IO, "%s: reading tensor %s failed: %s", f->path, t->name,
                            strerror(errno));
    return dt_error_set(DT_ERR_IO,
                        "%s: short read of tensor %s: got %zd of %zu bytes (file truncated?)",
                        f->path, t->name, r, want);
}

dt_status dt_st_read_f32_part(dt_st_file *f, const dt_st_tensor *t, size_t first, size_t n, float *dst) {
    if (!f || !t || t < f->tensors || t >= f->tensors + f->n)
        return dt_error_set(DT_ERR_INTERNAL, "dt_st_read_f32: tensor does not belong to %s",
                            f ? f->path : "(null file)");
    if (first > t->numel || n > t->numel - first)
        return dt_error_set(DT_ERR_INTERNAL, "dt_st_read_f32_part: elements %zu.. (%zu) of tensor %s of %zu", first, n,
                            t->name, (size_t)t->numel);
    if (t->dtype == DT_ST_F32) {
        ssize_t r = st_pread_full(f->fd, dst, 4 * n, f->data_start + t->offset + 4 * (uint64_t)first);
        if (r != (ssize_t)(4 * n)) return st_read_error(f, t, r < 0 ? r : (ssize_t)(4 * first) + r, t->nbytes);
        return DT_OK;
    }
    if (t->dtype != DT_ST_F16 && t->dtype != DT_ST_BF16)
        return dt_error_set(DT_ERR_DATA,
                            "%s: tensor %s has dtype %s; only F32, F16 and BF16 can be read as "
                            "float", f->path, t->name, t->dtype_name);
    const uint64_t base = f->data_start + t->offset + 2 * (uint64_t)first;
    unsigned char buf[ST_CHUNK];
    size_t done = 0; /* elements */
    while (done < n) {
        size_t k = n - done;
        if (k > ST_CHUNK / 2) k = ST_CHUNK / 2;
        ssize_t r = st_pread_full(f->fd, buf, 2 * k, base + 2 * done);
        if (r != (ssize_t)(2 * k))
            return st_read_error(f, t, r < 0 ? r : (ssize_t)(2 * (first + done)) + r, t->nbytes);
        for (size_t i = 0; i < k; i++) {
            uint16_t h = (uint16_t)(buf[2 * i] | (buf[2 * i + 1] << 8));
            dst[done + i] = t->dtype == DT_ST_F16 ? st_f16_to_f32(h) : st_bf16_to_f32(h);
        }
        done += k;
    }
    return DT_OK;
}

dt_status dt_st_read_f32(dt_st_file *f, const dt_st_tensor *t, float *dst) {
    return dt_st_read_f32_part(f, t, 0, t ? (size_t)t->numel : 0, dst);
}

/* ---- writing ---- */

/* Builds the compact header JSON; *numel_out gets each entry's element count. `filled`: the
 * data come from a fill function (dt_st_write_parts), not entries[i].data. */
static dt_status st_build_header(const char *path, const dt_st_entry *entries, int n,
                                 const char *const *meta_keys, const char *const *meta_values,
                                 int n_meta, int filled, size_t *numel_out, char **json_out) {
    dt_status st = DT_OK;
    json_t *root = json_object();
    if (!root) return dt_error_set(DT_ERR_NOMEM, "%s: out of memory building the header", path);
    if (n_meta > 0) {
        json_t *meta = json_object();
        if (!meta || json_object_set_new(root, "__metadata__", meta) != 0) goto nomem;
        for (int i = 0; i < n_meta; i++) {
            if (!meta_keys || !meta_values || !meta_keys[i] || !meta_values[i]) {
                st = dt_error_set(DT_ERR_INTERNAL, "%s: metadata entry %d is NULL", path, i);
                goto fail;
            }
            if (json_object_get(meta, meta_keys[i])) {
                st = dt_error_set(DT_ERR_INTERNAL, "%s: duplicate metadata key %s", path,
                                  meta_keys[i]);
                goto fail;
            }
            json_t *v = json_string(meta_values[i]);
            if (!v || json_object_set_new(meta, meta_keys[i], v) != 0) {
                st = dt_error_set(DT_ERR_INTERNAL,
                                  "%s: metadata %s: key and value must be valid UTF-8", path,
                                  meta_keys[i]);
                goto fail;
            }
        }
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        const dt_st_entry *e = &entries[i];
        if (!e->name || strcmp(e->name, "__metadata__") == 0 || json_object_get(root, e->name)) {
            st = dt_error_set(DT_ERR_INTERNAL, "%s: tensor %d: name %s is missing, reserved or "
                              "used twice", path, i, e->name ? e->name : "(null)");
            goto fail;
        }
        if (e->ndim < 0 || e->ndim > DT_ST_MAX_DIMS) {
            st = dt_error_set(DT_ERR_INTERNAL, "%s: tensor %s: ndim %d is outside 0..%d", path,
                              e->name, e->ndim, DT_ST_MAX_DIMS);
            goto fail;
        }
        size_t numel = 1;
        json_t *shape = json_array();
        if (!shape) goto nomem;
        for (int d = 0; d < e->ndim; d++) {
            if (e->shape[d] < 0 || __builtin_mul_overflow(numel, (size_t)e->shape[d], &numel)) {
                json_decref(shape);
                st = dt_error_set(DT_ERR_INTERNAL, "%s: tensor %s: invalid dimension %" PRId64,
                                  path, e->name, e->shape[d]);
                goto fail;
            }
            if (json_array_append_new(shape, json_integer((json_int_t)e->shape[d])) != 0) {
                json_decref(shape);
                goto nomem;
            }
        }
        if (numel > 0 && !e->data && !filled) {
            json_decref(shape);
            st = dt_error_set(DT_ERR_INTERNAL, "%s: tensor %s has no data", path, e->name);
            goto fail;
        }
        uint64_t end;
        if (numel > SIZE_MAX / 4 || __builtin_add_overflow(off, (uint64_t)numel * 4, &end) ||
            end > (uint64_t)INT64_MAX) {
            json_decref(shape);
            st = dt_error_set(DT_ERR_INTERNAL, "%s: tensor %s is too large", path, e->name);
            goto fail;
        }
        /* "o" steals the reference to shape, also when json_pack fails */
        json_t *obj = json_pack("{s:s, s:o, s:[I, I]}", "dtype", "F32", "shape", shape,
                                "data_offsets", (json_int_t)off, (json_int_t)end);
        if (!obj) goto nomem;
        if (json_object_set_new(root, e->name, obj) != 0) {
            st = dt_error_set(DT_ERR_INTERNAL, "%s: tensor name %s is not valid UTF-8", path,
                              e->name);
            goto fail;
        }
        numel_out[i] = numel;
        off = end;
    }
    *json_out = json_dumps(root, JSON_COMPACT);
    if (!*json_out) goto nomem;
    json_decref(root);
    return DT_OK;
nomem:
    st = dt_error_set(DT_ERR_NOMEM, "%s: out of memory building the header", path);
fail:
    json_decref(root);
    return st;
}

dt_status dt_st_write(const char *path, const dt_st_entry *entries, int n,
                      const char *const *meta_keys, const char *const *meta_values, int n_meta) {
    return dt_st_write_parts(path, entries, n, meta_keys, meta_values, n_meta, NULL, NULL);
}

dt_status dt_st_write_parts(const char *path, const dt_st_entry *entries, int n, const char *const *meta_keys,
                            const char *const *meta_values, int n_meta, dt_st_fill_fn fill, void *user) {
    dt_status st = DT_OK;
    char *json = NULL, *tmp = NULL;
    float *part = NULL;
    int fd = -1;
    size_t *numel = dt_calloc(n > 0 ? (size_t)n : 1, sizeof *numel, "safetensors write sizes");
    if (!numel) return DT_ERR_NOMEM;
    st = st_build_header(path, entries, n, meta_keys, meta_values, n_meta, fill != NULL, numel, &json);
    if (st != DT_OK) goto out;
    if (fill) { /* a part: the largest tensor's, at most DT_ST_PART floats */
        size_t most = 1;
        for (int i = 0; i < n; i++) most = numel[i] > most ? numel[i] : most;
        if (!(part = dt_malloc((most < DT_ST_PART ? most : DT_ST_PART) * sizeof(float), "safetensors write staging"))) {
            st = DT_ERR_NOMEM;
            goto out;
        }
    }

    size_t jlen = strlen(json);
    size_t hlen = (jlen + 7) / 8 * 8;
    size_t tlen = strlen(path) + 48;
    tmp = dt_malloc(tlen, "safetensors temp path");
    if (!tmp) {
        st = DT_ERR_NOMEM;
        goto out;
    }
    /* a fresh PATH.tmp.PID[.K]: a file or link already there is never followed or truncated */
    if ((st = dt_file_create_temp(path, tmp, tlen, &fd)) != DT_OK) goto out;
    unsigned char lenb[8];
    for (int i = 0; i < 8; i++) lenb[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    static const char spaces[8] = "        ";
    if (dt_file_write_all(fd, lenb, 8) != 0 || dt_file_write_all(fd, json, jlen) != 0 ||
        dt_file_write_all(fd, spaces, hlen - jlen) != 0)
        goto io_write;
    for (int i = 0; i < n; i++) {
        if (!fill) {
            if (numel[i] && dt_file_write_all(fd, entries[i].data, numel[i] * sizeof(float)) != 0) goto io_write;
            continue;
        }
        for (size_t first = 0; first < numel[i]; first += DT_ST_PART) {
            const size_t k = numel[i] - first < DT_ST_PART ? numel[i] - first : DT_ST_PART;
            if ((st = fill(user, i, first, k, part)) != DT_OK) goto fail;
            if (dt_file_write_all(fd, part, k * sizeof(float)) != 0) goto io_write;
        }
    }
    if (fsync(fd) != 0) goto io_write;
    int rc = close(fd);
    fd = -1;
    if (rc != 0) goto io_write;
    st = dt_file_commit(tmp, path);
    goto out;
io_write:
    st = dt_error_set(DT_ERR_IO, "%s: cannot write %s: %s", path, tmp, strerror(errno));
fail:
    if (fd >= 0) close(fd);
    fd = -1;
    unlink(tmp);
out:
    free(tmp);
    free(json);
    free(numel);
    free(part);
    return st;
}
