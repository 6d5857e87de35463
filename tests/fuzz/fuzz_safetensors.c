/* fuzz_safetensors.c — the safetensors reader (src/io/safetensors.c), and its writer on
 * what the reader accepted.
 *
 * Input: the file's bytes. Checked besides the sanitizers:
 *   - a refused file is an error with a message;
 *   - every tensor of an accepted file lies inside the data section, its byte size is
 *     numel * element size for F32/F16/BF16, dt_st_find finds it by its name, and it reads
 *     (dt_st_read_f32) into numel floats; other dtypes are refused with DT_ERR_DATA;
 *   - when every tensor is F32/F16/BF16, the tensors written back with dt_st_write reopen with
 *     the same names, shapes and bit-identical floats. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/safetensors.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_scratch();
    return 0;
}

static size_t elem_size(dt_st_dtype d) { return d == DT_ST_F32 ? 4 : (d == DT_ST_F16 || d == DT_ST_BF16) ? 2 : 0; }

/* Reads every tensor; vals[i] receives tensor i's floats (NULL for other dtypes). Returns 1
 * when all of them are float types. */
static int read_all(dt_st_file *f, uint64_t data_size, float **vals) {
    int all_float = 1;
    for (int i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        vals[i] = NULL;
        FUZZ_ASSERT(t->offset <= data_size && t->nbytes <= data_size - t->offset,
                    "tensor %s [%zu, +%zu) outside the %llu-byte data section", t->name, t->offset, t->nbytes,
                    (unsigned long long)data_size);
        FUZZ_ASSERT(dt_st_find(f, t->name) == t, "dt_st_find(\"%s\") finds another tensor", t->name);
        size_t es = elem_size(t->dtype);
        if (!es) {
            all_float = 0;
            float dummy;
            dt_status st = dt_st_read_f32(f, t, &dummy);
            FUZZ_ASSERT(st == DT_ERR_DATA, "dtype %s read as floats: %s", t->dtype_name, dt_status_str(st));
            continue;
        }
        FUZZ_ASSERT(t->nbytes == t->numel * es, "tensor %s: %zu bytes for %zu elements of %s", t->name, t->nbytes,
                    t->numel, t->dtype_name);
        vals[i] = malloc(t->numel ? t->numel * sizeof(float) : 1);
        dt_status st = dt_st_read_f32(f, t, vals[i]);
        FUZZ_ASSERT(st == DT_OK, "tensor %s does not read: %s", t->name, dt_error_msg());
    }
    return all_float;
}

static void check_write_back(dt_st_file *f, float **vals) {
    int n = dt_st_count(f);
    dt_st_entry *e = calloc((size_t)n + 1, sizeof *e);
    for (int i = 0; i < n; i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        e[i].name = t->name;
        e[i].ndim = t->ndim;
        memcpy(e[i].shape, t->shape, sizeof e[i].shape);
        e[i].data = vals[i];
    }
    char path[600];
    snprintf(path, sizeof path, "%s/back.safetensors", fuzz_scratch());
    const char *key = "producer", *val = "fuzz";
    dt_status st = dt_st_write(path, e, n, &key, &val, 1);
    FUZZ_ASSERT(st == DT_OK, "write back: %s", dt_error_msg());
    dt_st_file *g = NULL;
    st = dt_st_open(&g, path);
    FUZZ_ASSERT(st == DT_OK, "the file written back does not open: %s", dt_error_msg());
    FUZZ_ASSERT(dt_st_count(g) == n, "%d tensors written, %d read back", n, dt_st_count(g));
    const char *meta = dt_st_metadata(g, "producer");
    FUZZ_ASSERT(meta && strcmp(meta, "fuzz") == 0, "metadata lost");
    for (int i = 0; i < n; i++) {
        const dt_st_tensor *a = dt_st_tensor_at(f, i), *b = dt_st_find(g, a->name);
        FUZZ_ASSERT(b && b->dtype == DT_ST_F32 && b->ndim == a->ndim && b->numel == a->numel &&
                        memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) == 0,
                    "tensor %s changed on the way back", a->name);
        float *v = malloc(b->numel ? b->numel * sizeof(float) : 1);
        FUZZ_ASSERT(dt_st_read_f32(g, b, v) == DT_OK, "tensor %s: %s", a->name, dt_error_msg());
        FUZZ_ASSERT(memcmp(v, vals[i], b->numel * sizeof(float)) == 0, "tensor %s: values changed", a->name);
        free(v);
    }
    dt_st_close(g);
    free(e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[600];
    snprintf(path, sizeof path, "%s/in.safetensors", fuzz_scratch());
    fuzz_write(path, data, size);
    dt_st_file *f = NULL;
    dt_error_clear();
    dt_status st = dt_st_open(&f, path);
    fuzz_debug("dt_st_open", st);
    if (st != DT_OK) {
        FUZZ_ASSERT(f == NULL && dt_error_msg()[0], "status %s without a message", dt_status_str(st));
        return 0;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | data[i];
    (void)dt_st_metadata(f, "format");
    int n = dt_st_count(f);
    float **vals = calloc((size_t)n + 1, sizeof *vals);
    if (read_all(f, size - 8 - hlen, vals)) check_write_back(f, vals);
    for (int i = 0; i < n; i++) free(vals[i]);
    free(vals);
    dt_st_close(f);
    return 0;
}
