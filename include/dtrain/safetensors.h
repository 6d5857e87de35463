/* safetensors.h — read and write safetensors files (https://huggingface.co/docs/safetensors).
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON
 *   {"__metadata__": {"k": "v", ...}, "name": {"dtype": "F32", "shape": [..], "data_offsets": [b, e]}, ...}
 * padded with spaces to a multiple of 8, then the data. We write F32 only; we read F32, F16
 * and BF16 (converted to float). Every offset and shape is validated against the file size;
 * a malformed file is DT_ERR_DATA naming the file and what is wrong. */
#ifndef DTRAIN_SAFETENSORS_H
#define DTRAIN_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

#define DT_ST_MAX_DIMS 8

typedef enum { DT_ST_F32 = 0, DT_ST_F16, DT_ST_BF16, DT_ST_OTHER } dt_st_dtype;

typedef struct dt_st_tensor {
    const char *name;
    dt_st_dtype dtype;
    const char *dtype_name;      /* as written in the file */
    int ndim;
    int64_t shape[DT_ST_MAX_DIMS];
    size_t numel;
    size_t offset;               /* data offset relative to the start of the data section */
    size_t nbytes;
} dt_st_tensor;

typedef struct dt_st_file dt_st_file;

/* Opens and validates the header; data is read on demand. dt_st_close accepts NULL. A FIFO,
 * device or directory is refused at once (DT_ERR_DATA "PATH: not a regular file (a FIFO)"). */
dt_status dt_st_open(dt_st_file **out, const char *path);
void dt_st_close(dt_st_file *f);
int dt_st_count(const dt_st_file *f);
const dt_st_tensor *dt_st_tensor_at(const dt_st_file *f, int i);   /* in file order */
const dt_st_tensor *dt_st_find(const dt_st_file *f, const char *name); /* NULL if absent */
/* metadata value or NULL */
const char *dt_st_metadata(const dt_st_file *f, const char *key);
/* Reads tensor `t` converted to float into dst (t->numel floats). DT_ERR_DATA for an
 * unsupported dtype, DT_ERR_IO for a read failure. */
dt_status dt_st_read_f32(dt_st_file *f, const dt_st_tensor *t, float *dst);
/* The same for elements [first, first + n) of t (in its row-major order) into dst (n floats). */
dt_status dt_st_read_f32_part(dt_st_file *f, const dt_st_tensor *t, size_t first, size_t n, float *dst);

typedef struct dt_st_entry {
    const char *name;
    int ndim;
    int64_t shape[DT_ST_MAX_DIMS];
    const float *data;           /* host memory, prod(shape) floats (dt_st_write_parts: unused) */
} dt_st_entry;

/* Writes F32 tensors in the given order plus optional metadata (n_meta key/value pairs,
 * may be 0). Atomic: writes a fresh `path`.tmp.<pid> (created O_EXCL|O_NOFOLLOW; when the
 * name is taken, by a stale file or a planted link, `path`.tmp.<pid>.<k>: what is there is
 * never followed, truncated or removed), fsyncs, renames over `path`, fsyncs the directory. */
dt_status dt_st_write(const char *path, const dt_st_entry *entries, int n,
                      const char *const *meta_keys, const char *const *meta_values, int n_meta);

/* dt_st_write's file, each tensor's data asked of `fill` a part at a time (at most
 * DT_ST_PART floats: elements [first, first + n) of entry i into buf) rather than read from
 * entries[i].data, so a writer stages one part instead of the whole file (a device's weights,
 * the optimizer's moments). A fill's failure stops the write and leaves no file. */
#define DT_ST_PART ((size_t)1 << 20)
typedef dt_status (*dt_st_fill_fn)(void *user, int i, size_t first, size_t n, float *buf);
dt_status dt_st_write_parts(const char *path, const dt_st_entry *entries, int n, const char *const *meta_keys,
                            const char *const *meta_values, int n_meta, dt_st_fill_fn fill, void *user);

#endif
